package models

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net/url"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"go.opentelemetry.io/otel/trace"
	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"
)

// Dialect names the database behind a *gorm.DB.
type Dialect string

// The two supported dialects (docs/reference.md §6).
const (
	Postgres Dialect = "postgres"
	SQLite   Dialect = "sqlite"
)

//go:embed migrations
var migrations embed.FS

// OpenOptions says which database to open. DatabaseURL wins when set; otherwise SQLitePath is
// used. MaxConns is the PostgreSQL pool size (default 16: fewer loses throughput under load,
// see issue 2); SQLite ignores it. ConnectTimeout bounds each new PostgreSQL connection (dial
// and handshake) and Open's first contact with either database (default 10s): a database that
// accepts TCP and then sends nothing must not hold a caller, or Open itself, for the stall.
// A connect_timeout in DatabaseURL (seconds) takes precedence for PostgreSQL's connections;
// with several hosts it bounds the attempt at each host.
type OpenOptions struct {
	DatabaseURL    string
	SQLitePath     string
	MaxConns       int
	ConnectTimeout time.Duration
	// StoreTimeout bounds every transaction begun with DB.Tx (0: no bound of its own): the
	// context's deadline, SQLite's busy_timeout, and on PostgreSQL the server's own
	// idle_in_transaction_session_timeout for the transaction (see DB.Tx).
	StoreTimeout time.Duration
	// TracerProvider, when not nil, gets a client span for every statement (and PostgreSQL
	// pool acquire and connect): pgx's tracer (otelpgx) on PostgreSQL, so the statements that
	// skip GORM are traced too, and a wrapped database/sql driver (otelsql) on SQLite. Spans
	// carry the statement text, which holds no secrets since every value is a bound
	// parameter, and never the parameters. nil (tracing off) opens the database exactly as
	// without tracing: no wrapper, no tracer hook.
	TracerProvider trace.TracerProvider
}

// DB is an open database with its dialect. Pool is the pgx pool under GORM on PostgreSQL (nil
// on SQLite), for the few statements that skip GORM on the hot path.
type DB struct {
	*gorm.DB
	Dialect Dialect
	Pool    *pgxpool.Pool
	// StoreTimeout is OpenOptions.StoreTimeout.
	StoreTimeout time.Duration

	// writer, on SQLite only (nil on PostgreSQL), is the turn at SQLite's one write lock of
	// everything written through this DB (serve opens one per process): Tx and Write take it
	// before they begin. Every transaction here begins IMMEDIATE, so without
	// it concurrent transactions contend inside SQLite, whose busy handler polls with sleeps
	// of up to 100 ms and serves no one in order: measured with 32 goroutines writing through
	// 8 connections, about 1 transaction in 300 waited past a 1 s busy_timeout and failed with
	// SQLITE_BUSY though each held the lock for about 2 ms. Goroutines blocked sending on a
	// channel are woken in the order they blocked, so here they queue first come, first
	// served, and the lock passes on as soon as its holder commits. busy_timeout still
	// arbitrates with other processes on the file (idemgate commands run beside serve), and
	// a holder that meets such a process's lock holds up the queue while it waits.
	writer chan struct{}
}

// Open opens PostgreSQL when opts.DatabaseURL is set, else the SQLite file at opts.SQLitePath
// (created if missing). It does not migrate; call Migrate. It fails if the database cannot be
// reached at all, so a typo in DATABASE_URL is reported at start.
func Open(ctx context.Context, opts OpenOptions) (*DB, error) {
	cfg := &gorm.Config{
		Logger: logger.Discard,
		// No GORM-level prepared statements: pgx already caches prepared statements on each
		// pooled connection (QueryExecModeCacheStatement), and database/sql's per-handle
		// statements would be re-prepared every time a pgxpool connection is borrowed.
		TranslateError:         true,
		SkipDefaultTransaction: true,
		NowFunc:                func() time.Time { return time.Now().UTC().Truncate(time.Microsecond) },
	}
	var (
		g       *gorm.DB
		err     error
		dialect Dialect
		pool    *pgxpool.Pool
	)
	if opts.DatabaseURL != "" {
		dialect = Postgres
		pool, err = openPool(ctx, opts)
		if err != nil {
			return nil, err
		}
		// GORM and database/sql borrow from the pgxpool, so every query shares one bounded,
		// fair (FIFO) pool: database/sql hands a freed connection to a random waiter, which
		// tripled p99 latency at 64 concurrent requests on 16 connections.
		g, err = gorm.Open(postgres.New(postgres.Config{Conn: stdlib.OpenDBFromPool(pool)}), cfg)
	} else {
		dialect = SQLite
		var dialector gorm.Dialector
		if dialector, err = openSQLite(opts); err == nil {
			g, err = gorm.Open(dialector, cfg)
		}
	}
	if err != nil {
		if pool != nil {
			pool.Close()
		}
		return nil, fmt.Errorf("open %s database: %w", dialect, err)
	}
	sqlDB, err := g.DB()
	if err != nil {
		return nil, fmt.Errorf("open %s database: %w", dialect, err)
	}
	if dialect == SQLite {
		// One writer at a time is SQLite's rule; immediate transactions plus busy_timeout make
		// writers queue instead of failing, and WAL keeps readers off the writer's path.
		sqlDB.SetMaxOpenConns(8)
		sqlDB.SetMaxIdleConns(8)
	}
	pingCtx, cancel := context.WithTimeout(ctx, opts.connectTimeout())
	defer cancel()
	if err := sqlDB.PingContext(pingCtx); err != nil {
		_ = sqlDB.Close()
		if pool != nil {
			pool.Close()
		}
		return nil, fmt.Errorf("connect to %s database: %w", dialect, err)
	}
	d := &DB{DB: g, Dialect: dialect, Pool: pool, StoreTimeout: opts.StoreTimeout}
	if dialect == SQLite {
		d.writer = make(chan struct{}, 1)
	}
	return d, nil
}

// openPool opens the PostgreSQL connection pool: opts.MaxConns connections (default 16; fewer
// loses throughput under load, see issue 2), connected lazily.
func openPool(ctx context.Context, opts OpenOptions) (*pgxpool.Pool, error) {
	pc, err := pgxpool.ParseConfig(opts.DatabaseURL)
	if err != nil {
		return nil, fmt.Errorf("parse DATABASE_URL: %w", err)
	}
	pc.MaxConns = 16
	if opts.MaxConns > 0 {
		pc.MaxConns = int32(opts.MaxConns)
	}
	pc.MaxConnIdleTime = 5 * time.Minute
	// A connect_timeout in the URL wins: with several hosts (docs/operations.md "High
	// availability") pgx applies it to each host in turn, so an operator sets it short
	// enough that a host which drops packets costs little before the next is tried.
	if pc.ConnConfig.ConnectTimeout == 0 {
		pc.ConnConfig.ConnectTimeout = opts.connectTimeout()
	}
	// pgx's default caches a named prepared statement per connection: the fast mode (the
	// acquire statement is parsed and planned once per connection; measured 2.2× the
	// throughput of the alternative). Behind a pooler in transaction mode (PgBouncer's
	// pool_mode=transaction) each transaction may get another server session, where that name
	// already exists (42P05) or does not (26000), so there statements go unnamed with only
	// their description cached (cache_describe), which leaves nothing on the server. Which one
	// applies is detected (behindPooler); a DATABASE_URL that names default_query_exec_mode
	// keeps its own choice.
	if !strings.Contains(opts.DatabaseURL, "default_query_exec_mode") {
		pooled, err := behindPooler(ctx, pc.ConnConfig, opts.connectTimeout())
		if err != nil {
			return nil, fmt.Errorf("connect to postgres: %w", err)
		}
		if pooled {
			pc.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeCacheDescribe
		}
	}
	pc.ConnConfig.OnPgError = dropDemoted(pc.ConnConfig.OnPgError)
	if opts.TracerProvider != nil {
		pc.ConnConfig.Tracer = pgxTracer(opts.TracerProvider)
	}
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return nil, fmt.Errorf("open postgres pool: %w", err)
	}
	return pool, nil
}

// readOnlyTransaction is SQLSTATE 25006 (read_only_sql_transaction): a write sent to a server
// that is in recovery, i.e. a standby.
const readOnlyTransaction = "25006"

// dropDemoted wraps a connection's PostgreSQL error handler (next: pgconn's default, which
// closes the connection on FATAL errors) so that a connection whose server refuses a write as
// read-only is closed too, and the pool replaces it.
//
// Why: with a multi-host DATABASE_URL and target_session_attrs=read-write (docs/operations.md
// "High availability") a connection is checked to be read-write only when it is made. A
// primary that is demoted without restarting (a fenced node that rejoins as a standby while
// our connection survives, or a pooler in between that keeps its server sessions) would then
// keep refusing every write on that pooled connection for as long as it lived; closed, the next
// connection is made through the host list again and lands on the new primary. The failed
// statement itself changed nothing and is answered 503 store_unavailable (services.IsUnavailable).
func dropDemoted(next pgconn.PgErrorHandler) pgconn.PgErrorHandler {
	return func(c *pgconn.PgConn, pe *pgconn.PgError) bool {
		if pe.Code == readOnlyTransaction {
			return false
		}
		if next == nil {
			return !strings.EqualFold(pe.Severity, "FATAL")
		}
		return next(c, pe)
	}
}

// behindPooler reports whether connections made with cfg reach PostgreSQL through a connection
// pooler such as PgBouncer: one connection is made, and the backend process id that the server
// reports for the session (pg_backend_pid()) is compared with the one in the connection's
// greeting (BackendKeyData). PostgreSQL sends its own pid there; a pooler answers the client's
// start-up itself and sends a key of its own, since cancel requests go to the pooler. The
// probe uses the simple protocol, so it leaves no prepared statement behind. timeout bounds it.
func behindPooler(ctx context.Context, cfg *pgx.ConnConfig, timeout time.Duration) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	c := cfg.Copy()
	c.DefaultQueryExecMode = pgx.QueryExecModeSimpleProtocol
	conn, err := pgx.ConnectConfig(ctx, c)
	if err != nil {
		return false, err
	}
	defer func() { _ = conn.Close(context.WithoutCancel(ctx)) }()
	var pid int64
	if err := conn.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
		return false, err
	}
	return pid != int64(conn.PgConn().PID()), nil
}

// QueryExecMode names how statements are sent on PostgreSQL: "cache_statement" (named
// prepared statements, on a direct connection) or "cache_describe" (unnamed, behind a pooler),
// or the mode DATABASE_URL names; "" on SQLite.
func (d *DB) QueryExecMode() string {
	if d.Pool == nil {
		return ""
	}
	return strings.ReplaceAll(d.Pool.Config().ConnConfig.DefaultQueryExecMode.String(), " ", "_")
}

// Tx runs fn in a transaction bounded by d.StoreTimeout (when set): fn's context gets that
// deadline unless ctx already ends sooner, and on PostgreSQL the transaction first sets
// idle_in_transaction_session_timeout (SET LOCAL: it ends with the transaction, so it holds
// behind PgBouncer in transaction mode too) to the store timeout plus one second.
//
// Why the server-side bound: a client cut off mid-transaction by a stalled network (no FIN,
// no RST) gives up at its deadline, but the server keeps the session idle in transaction with
// its row locks until TCP keepalive notices, hours later; every other instance's acquires of
// that key and every reaper then wait on the lock. With the setting the server ends such a
// session itself shortly after the client has given up. A transaction is never idle that
// long while its request is alive, since the request's own deadline is the store timeout.
//
// On SQLite, transactions of this process wait for their turn at the write lock first come,
// first served, within the same deadline (see DB.writer).
//
// Errors: fn's error, or the database's (a deadline is context.DeadlineExceeded).
func (d *DB) Tx(ctx context.Context, fn func(tx *gorm.DB) error) error {
	return d.Write(ctx, func(db *gorm.DB) error {
		return db.Transaction(func(tx *gorm.DB) error {
			if d.Dialect == Postgres && d.StoreTimeout > 0 {
				idle := (d.StoreTimeout + time.Second).Milliseconds()
				if err := tx.Exec(fmt.Sprintf("SET LOCAL idle_in_transaction_session_timeout = %d", idle)).Error; err != nil {
					return err
				}
			}
			return fn(tx)
		})
	})
}

// Write runs fn's writes outside a transaction, bounded like Tx (which is Write around a
// transaction); on SQLite only after taking this DB's turn at the write lock. A lone statement that does not wait its turn
// polls for the lock in SQLite's busy handler and gets it only in the gaps between queued
// transactions: during a storm on one key up to a third of such writes failed SQLITE_BUSY
// within a 1 s deadline (TestSessionStoreWritesDuringSQLiteStorm). fn gets the handle to
// write on, with the bounded context. On PostgreSQL it is a plain call: no transaction, no
// queue. Errors: fn's, or context.DeadlineExceeded while waiting for the turn.
func (d *DB) Write(ctx context.Context, fn func(db *gorm.DB) error) error {
	ctx, cancel := d.Bounded(ctx)
	defer cancel()
	if err := d.takeTurn(ctx); err != nil {
		return err
	}
	defer d.giveTurn()
	return fn(d.DB.WithContext(ctx))
}

// takeTurn waits for this DB's turn at SQLite's write lock (DB.writer), first come, first
// served, or until ctx ends; nothing to wait for on PostgreSQL. A successful call must be
// followed by giveTurn.
func (d *DB) takeTurn(ctx context.Context) error {
	if d.writer == nil {
		return nil
	}
	select {
	case d.writer <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (d *DB) giveTurn() {
	if d.writer != nil {
		<-d.writer
	}
}

// Bounded returns ctx with a deadline d.StoreTimeout from now (ctx itself, with a no-op cancel,
// when StoreTimeout is 0), for database work that no request bounds, such as the reaper's.
func (d *DB) Bounded(ctx context.Context) (context.Context, context.CancelFunc) {
	if d.StoreTimeout <= 0 {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, d.StoreTimeout)
}

func (o OpenOptions) connectTimeout() time.Duration {
	if o.ConnectTimeout > 0 {
		return o.ConnectTimeout
	}
	return 10 * time.Second
}

// sqliteDSN is the SQLite connection string. busy is how long a writer waits for the write
// lock (0: 10 s); with a store timeout it is that timeout, so a locked database is answered
// when the request's deadline passes rather than after it, with SQLITE_BUSY, which
// services map to store_unavailable.
func sqliteDSN(path string, busy time.Duration) string {
	if busy <= 0 {
		busy = 10 * time.Second
	}
	q := url.Values{}
	q.Add("_pragma", fmt.Sprintf("busy_timeout(%d)", max(busy.Milliseconds(), 1)))
	q.Add("_pragma", "journal_mode(WAL)")
	// FULL: in WAL mode NORMAL leaves the last commits in the WAL unsynced, so a power failure
	// can lose an admission already answered 201 and the key would be admitted again.
	q.Add("_pragma", "synchronous(FULL)")
	q.Add("_pragma", "foreign_keys(1)")
	q.Set("_txlock", "immediate")
	return "file:" + path + "?" + q.Encode()
}

// Close closes the connection pool.
func (d *DB) Close() error {
	sqlDB, err := d.DB.DB()
	if err != nil {
		return err
	}
	err = sqlDB.Close()
	if d.Pool != nil {
		d.Pool.Close() // closing the *sql.DB does not close the pool under it
	}
	return err
}

// Now returns the database clock (docs/reference.md §6: expiry is judged by the database, never by each
// server's clock, so instances with skewed clocks agree). On SQLite the database lives in this
// process, so its clock is the process clock. Times are UTC with microsecond precision, the
// precision PostgreSQL stores.
func (d *DB) Now(ctx context.Context, tx *gorm.DB) (time.Time, error) {
	if d.Dialect != Postgres {
		return time.Now().UTC().Truncate(time.Microsecond), nil
	}
	var now time.Time
	if err := tx.WithContext(ctx).Raw("SELECT clock_timestamp()").Scan(&now).Error; err != nil {
		return time.Time{}, err
	}
	return now.UTC(), nil
}

// Migrate applies every pending migration of d's dialect, under a transaction-scoped advisory
// lock on PostgreSQL (xactLocker: no session state, so it holds behind PgBouncer in transaction
// mode too) so that several instances starting at once migrate exactly once, then this build's
// functions and triggers (models/sql, see applySQL) when the database has an older revision of
// them. It returns the number of migrations applied. Errors: ErrPreBaseline,
// ErrSQLRevisionConflict, or the database's.
func Migrate(ctx context.Context, d *DB, log *slog.Logger) (int, error) {
	sqlDB, err := d.DB.DB()
	if err != nil {
		return 0, err
	}
	sub, err := fs.Sub(migrations, "migrations/"+string(d.Dialect))
	if err != nil {
		return 0, err
	}
	opts := []goose.ProviderOption{goose.WithDisableGlobalRegistry(true)}
	gd := goose.DialectSQLite3
	if d.Dialect == Postgres {
		gd = goose.DialectPostgres
		l := newXactLocker(d.Pool.Config().ConnConfig)
		l.log = log
		opts = append(opts, goose.WithLocker(l))
	}
	p, err := goose.NewProvider(gd, sqlDB, sub, opts...)
	if err != nil {
		return 0, fmt.Errorf("prepare migrations: %w", err)
	}
	if v, err := p.GetDBVersion(ctx); err == nil && v > 0 && v < baselineVersion {
		return 0, fmt.Errorf("%w: it is at version %d; migrate it with a build from before the baseline first, or start from an empty database",
			ErrPreBaseline, v)
	}
	res, err := p.Up(ctx)
	if err != nil {
		return 0, fmt.Errorf("apply migrations: %w", err)
	}
	for _, r := range res {
		if log != nil {
			log.Info("migration applied", "version", r.Source.Version, "path", r.Source.Path)
		}
	}
	sum, err := sqlChecksum()
	if err != nil {
		return 0, err
	}
	applied, err := applySQL(ctx, d, sqlRevisions, sum, log)
	if err != nil {
		return 0, fmt.Errorf("apply functions and triggers: %w", err)
	}
	if applied && log != nil {
		log.Info("functions and triggers applied", "revision", len(sqlRevisions)-1)
	}
	return len(res), nil
}

// baselineVersion is the version of the squashed baseline migration (00016_baseline.sql):
// the pre-release chain's last version, so a database that chain migrated fully is at it.
const baselineVersion = 16

// ErrPreBaseline is returned by Migrate for a database the pre-release migration chain left
// between versions 1 and 15: the baseline would create tables it already has, and the steps
// between are no longer in this build.
var ErrPreBaseline = errors.New("the database was migrated by a pre-release build of idemgate, before the squashed baseline")

// SQL returns the underlying *sql.DB (for pool statistics and health checks).
func (d *DB) SQL() (*sql.DB, error) { return d.DB.DB() }
