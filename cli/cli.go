// Package cli is idemgate's command line (docs/reference.md §7), built with cobra: serve (the default),
// migrate, apikey create/revoke/list, operator create/list/delete/passwd, tenant list,
// webhook create/list/delete/disable/enable, reap, version. It reads configuration from the
// environment (config.go) and wires models, services and web together.
package cli

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/idemgate/idemgate/models"
	"github.com/idemgate/idemgate/services"
	"github.com/idemgate/idemgate/web/logging"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/mattn/go-isatty"
	"github.com/spf13/cobra"
	"go.opentelemetry.io/otel/trace"
)

// Env is the process environment the commands run in, injected so tests can run them in
// process (Mat Ryer's run(ctx, args, getenv, …) pattern).
type Env struct {
	Getenv func(string) string
	Stdin  io.Reader
	Stdout io.Writer
	Stderr io.Writer
}

// Execute runs the command line args (without the program name) and returns its error, which
// it has already printed.
func Execute(ctx context.Context, args []string, env Env) error {
	root := newRoot(env)
	root.SetArgs(args)
	root.SetIn(env.Stdin)
	root.SetOut(env.Stdout)
	root.SetErr(env.Stderr)
	return root.ExecuteContext(ctx)
}

func newRoot(env Env) *cobra.Command {
	root := &cobra.Command{
		Use:   "idemgate",
		Short: "Idempotency-key admission service with a reconciliation dashboard",
		Long: "idemgate admits each business operation once: services acquire an idempotency key with a TTL,\n" +
			"record the confirmed outcome or release the key, and operators reconcile uncertain operations.\n" +
			"With no command, idemgate serves. Configuration comes from the environment (see docs/operations.md).",
		SilenceUsage: true,
		RunE:         func(cmd *cobra.Command, _ []string) error { return serve(cmd.Context(), env) },
	}
	serveCmd := &cobra.Command{Use: "serve", Short: "Serve the JSON API and dashboard (default)", Args: cobra.NoArgs,
		Long: "Migrate the database, create the first admin account and API key if there are none, then serve\n" +
			"the JSON API and the dashboard and run the reaper until SIGINT or SIGTERM.",
		RunE: func(cmd *cobra.Command, _ []string) error { return serve(cmd.Context(), env) }}
	root.AddCommand(
		serveCmd,
		&cobra.Command{Use: "migrate", Short: "Apply pending database migrations and exit", Args: cobra.NoArgs,
			RunE: func(cmd *cobra.Command, _ []string) error { return migrate(cmd.Context(), env) }},
		&cobra.Command{Use: "reap", Short: "Run one reaper pass: expire holds, purge old evidence", Args: cobra.NoArgs,
			RunE: func(cmd *cobra.Command, _ []string) error { return reap(cmd.Context(), env) }},
		apikeyCmd(env),
		operatorCmd(env),
		tenantCmd(env),
		versionCmd(env),
		webhookCmd(env),
		policyCmd(env),
		proxyCmd(env),
		mcpGatewayCmd(env),
	)
	// The environment variables (dozens of lines) follow the usage and the command list in
	// the help of the two commands that serve, so the commands are what one sees first.
	usageHelp := root.HelpFunc()
	root.SetHelpFunc(func(cmd *cobra.Command, args []string) {
		usageHelp(cmd, args)
		if cmd == root || cmd == serveCmd {
			fmt.Fprint(cmd.OutOrStdout(), "\n"+variablesHelp())
		}
	})
	// Cobra adds its completion command only when executing; adding it now lets the walk below
	// make it a group like the others (`idemgate completion bogus` printed help, exit 0).
	root.InitDefaultCompletionCmd()
	var groups func(*cobra.Command)
	groups = func(cmd *cobra.Command) {
		for _, c := range cmd.Commands() {
			if c.HasSubCommands() && c.RunE == nil && c.Run == nil {
				asGroup(c)
			}
			groups(c)
		}
	}
	groups(root)
	return root
}

// asGroup makes cmd, a command that only holds subcommands, print its help when called alone
// and refuse anything else as an unknown command (exit status 1). Cobra's default for a
// command without RunE prints the help and succeeds, so `idemgate apikey lst` looked like it
// worked (issue 28).
func asGroup(cmd *cobra.Command) {
	cmd.Args = func(c *cobra.Command, args []string) error {
		if len(args) > 0 {
			return fmt.Errorf("unknown command %q for %q; see %q", args[0], c.CommandPath(), c.CommandPath()+" --help")
		}
		return nil
	}
	cmd.RunE = func(c *cobra.Command, _ []string) error { return c.Help() }
}

// newLogger returns the process's logger: JSON lines (or text on a terminal, or as
// configured) at cfg.LogLevel, with the request id of the context on every record logged
// during a request (logging.NewHandler).
func newLogger(cfg Config, w io.Writer) *slog.Logger {
	format := cfg.LogFormat
	if format == "" {
		format = "json"
		if f, ok := w.(*os.File); ok && isatty.IsTerminal(f.Fd()) {
			format = "text"
		}
	}
	opts := &slog.HandlerOptions{Level: cfg.LogLevel}
	if format == "text" {
		return slog.New(logging.NewHandler(slog.NewTextHandler(w, opts)))
	}
	return slog.New(logging.NewHandler(slog.NewJSONHandler(w, opts)))
}

// open loads the configuration, opens the database and migrates it.
func open(ctx context.Context, env Env) (Config, *slog.Logger, *models.DB, error) {
	cfg, log, err := configure(env)
	if err != nil {
		return cfg, log, nil, err
	}
	db, err := openDB(ctx, cfg, log, nil)
	return cfg, log, db, err
}

// configure loads and validates the configuration and makes the logger it asks for. The
// logger is nil when the configuration is invalid.
func configure(env Env) (Config, *slog.Logger, error) {
	cfg, err := LoadConfig(env.Getenv)
	if err != nil {
		return cfg, nil, fmt.Errorf("configuration: %w", err)
	}
	return cfg, newLogger(cfg, env.Stderr), nil
}

// openDB opens the configured database and migrates it; its statements are traced to tp (nil:
// not traced; see models.OpenOptions.TracerProvider). A migration cut off by the database
// going away (a primary failing over between the connection and the migration:
// docs/operations.md "High availability") is retried like the connection, within
// cfg.StartTimeout of the start: each migration runs in its own transaction, so a retry
// resumes where the committed ones end.
func openDB(ctx context.Context, cfg Config, log *slog.Logger, tp trace.TracerProvider) (*models.DB, error) {
	start := time.Now()
	for {
		db, err := connect(ctx, cfg, log, tp)
		if err != nil {
			return nil, err
		}
		_, err = models.Migrate(ctx, db, log)
		if err == nil {
			return db, nil
		}
		_ = db.Close()
		if !services.IsUnavailable(err) || ctx.Err() != nil || time.Since(start)+connectRetryDelay > cfg.StartTimeout {
			return nil, err
		}
		log.Warn("database went away during migration, retrying", "err", err, "retry_in", connectRetryDelay.String())
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(connectRetryDelay):
		}
	}
}

// checkSQLiteDir says clearly that the SQLite file's directory is missing (or not a
// directory): the driver itself reports only "unable to open database file: out of memory
// (14)".
func checkSQLiteDir(path string) error {
	dir := filepath.Dir(path)
	st, err := os.Stat(dir)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return fmt.Errorf("IDEMGATE_SQLITE_PATH=%s: directory %s does not exist; create it (mkdir -p %s) or choose another path", path, dir, dir)
	case err != nil:
		return fmt.Errorf("IDEMGATE_SQLITE_PATH=%s: %w", path, err)
	case !st.IsDir():
		return fmt.Errorf("IDEMGATE_SQLITE_PATH=%s: %s is not a directory", path, dir)
	}
	return nil
}

// connectRetryDelay is the pause between two attempts to reach the database at start-up.
const connectRetryDelay = time.Second

// connect opens the database, saying which one, and retries while it is unreachable (down,
// starting, or stalled: each attempt is bounded by cfg.StoreTimeout) until cfg.StartTimeout has
// passed. A database that refuses us for another reason (a bad URL, wrong password, unknown
// database) fails at once: retrying cannot fix it.
func connect(ctx context.Context, cfg Config, log *slog.Logger, tp trace.TracerProvider) (*models.DB, error) {
	opts := models.OpenOptions{DatabaseURL: cfg.DatabaseURL, SQLitePath: cfg.SQLitePath, MaxConns: cfg.DBMaxConns,
		ConnectTimeout: cfg.StoreTimeout, StoreTimeout: cfg.StoreTimeout, TracerProvider: tp}
	if cfg.DatabaseURL == "" {
		log.Info("opening database", "dialect", models.SQLite, "path", cfg.SQLitePath)
		if err := checkSQLiteDir(cfg.SQLitePath); err != nil {
			return nil, err
		}
		return models.Open(ctx, opts)
	}
	host, name := describePostgres(cfg.DatabaseURL)
	log.Info("connecting to database", "dialect", models.Postgres, "host", host, "database", name,
		"attempt_timeout", cfg.StoreTimeout.String(), "give_up_after", cfg.StartTimeout.String())
	start := time.Now()
	for attempt := 1; ; attempt++ {
		db, err := models.Open(ctx, opts)
		if err == nil {
			// The statement mode says whether a pooler (PgBouncer) was detected in between:
			// cache_describe behind one, cache_statement on a direct connection.
			log.Info("connected to database", "host", host, "attempts", attempt, "query_exec_mode", db.QueryExecMode())
			return db, nil
		}
		left := cfg.StartTimeout - time.Since(start)
		if !services.IsUnavailable(err) || ctx.Err() != nil || left < connectRetryDelay {
			return nil, fmt.Errorf("database at %s: %w (%d attempts in %s)", host, err, attempt,
				time.Since(start).Round(time.Millisecond))
		}
		log.Warn("database not reachable, retrying", "host", host, "attempt", attempt, "err", err,
			"retry_in", connectRetryDelay.String(), "give_up_in", left.Round(time.Second).String())
		select {
		case <-ctx.Done():
		case <-time.After(connectRetryDelay):
		}
	}
}

// describePostgres names the database of url for logs, without its password: host:port and
// database name (the first host of a multi-host URL). An unparsable URL gives "?": Open reports
// why.
func describePostgres(url string) (host, database string) {
	pc, err := pgconn.ParseConfig(url)
	if err != nil {
		return "?", "?"
	}
	return net.JoinHostPort(pc.Host, strconv.Itoa(int(pc.Port))), pc.Database
}

func migrate(ctx context.Context, env Env) error {
	_, log, db, err := open(ctx, env)
	if err != nil {
		return err
	}
	defer db.Close()
	log.Info("database is up to date", "dialect", db.Dialect)
	return nil
}

func reap(ctx context.Context, env Env) error {
	cfg, log, db, err := open(ctx, env)
	if err != nil {
		return err
	}
	defer db.Close()
	res, err := services.NewReaper(db, log, cfg.Retention).RunOnce(ctx)
	if err != nil {
		return err
	}
	fmt.Fprintf(env.Stdout, "holds_expired=%d marked_uncertain=%d operations_purged=%d attempts_purged=%d "+
		"events_purged=%d tombstones_written=%d sessions_purged=%d\n", res.HoldsExpired, res.MarkedUncertain,
		res.OperationsPurged, res.AttemptsPurged, res.EventsPurged, res.TombstonesWritten, res.SessionsPurged)
	return nil
}

func apikeyCmd(env Env) *cobra.Command {
	cmd := &cobra.Command{Use: "apikey", Short: "Create, list or revoke API keys"}
	var tenant, label string
	create := &cobra.Command{
		Use:   "create --tenant NAME [--label L]",
		Short: "Create an API key (and the tenant if new); prints only the secret on stdout",
		Args:  cobra.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			_, log, db, err := open(c.Context(), env)
			if err != nil {
				return err
			}
			defer db.Close()
			secret, err := services.NewAccounts(db, log, nil).CreateAPIKey(c.Context(), services.Installation(), tenant, label, "")
			if err != nil {
				return describe(err)
			}
			fmt.Fprintln(env.Stdout, secret)
			return nil
		},
	}
	create.Flags().StringVar(&tenant, "tenant", "", "tenant name (required; 1-64 of A-Z a-z 0-9 . _ : -)")
	create.Flags().StringVar(&label, "label", "", "free-text label shown to operators")
	_ = create.MarkFlagRequired("tenant")
	revoke := &cobra.Command{
		Use:   "revoke PREFIX_OR_SECRET",
		Short: "Revoke an API key by its display prefix or its secret (stops working within 1 s everywhere)",
		Args:  cobra.ExactArgs(1),
		RunE: func(c *cobra.Command, args []string) error {
			_, log, db, err := open(c.Context(), env)
			if err != nil {
				return err
			}
			defer db.Close()
			n, err := services.NewAccounts(db, log, nil).RevokeAPIKey(c.Context(), services.Installation(), services.APIKeyRef{Key: args[0]})
			if errors.Is(err, services.ErrNotFound) {
				return errors.New("no unrevoked API key has that prefix or secret")
			} else if err != nil {
				return err
			}
			fmt.Fprintf(env.Stdout, "revoked %d API key(s)\n", n)
			return nil
		},
	}
	cmd.AddCommand(create, revoke, apikeyListCmd(env))
	return cmd
}

func operatorCmd(env Env) *cobra.Command {
	cmd := &cobra.Command{Use: "operator", Short: "Manage dashboard accounts"}
	var username, role, tenant string
	create := &cobra.Command{
		Use:   "create --username U --role admin|operator|auditor [--tenant T]",
		Short: "Create a dashboard account; password from IDEMGATE_PASSWORD or the first line of stdin",
		Args:  cobra.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			password := env.Getenv("IDEMGATE_PASSWORD")
			if password == "" {
				line, err := bufio.NewReader(env.Stdin).ReadString('\n')
				if err != nil && line == "" {
					return errors.New("no password: set IDEMGATE_PASSWORD or write it on stdin")
				}
				password = strings.TrimRight(line, "\r\n")
			}
			_, log, db, err := open(c.Context(), env)
			if err != nil {
				return err
			}
			defer db.Close()
			acct, err := services.NewAccounts(db, log, nil).CreateOperator(c.Context(), services.Installation(), username, password, role, tenant)
			if err != nil {
				return describe(err)
			}
			fmt.Fprintf(env.Stdout, "created %s %q\n", acct.Role, acct.Username)
			return nil
		},
	}
	create.Flags().StringVar(&username, "username", "", "login name (required)")
	create.Flags().StringVar(&role, "role", "", "admin, operator or auditor (required)")
	create.Flags().StringVar(&tenant, "tenant", "", "restrict the account to this tenant (default: global)")
	_ = create.MarkFlagRequired("username")
	_ = create.MarkFlagRequired("role")
	cmd.AddCommand(append([]*cobra.Command{create}, operatorAdminCmds(env)...)...)
	return cmd
}

// describe turns a validation error into one readable line per field.
func describe(err error) error {
	var de *services.Error
	if errors.As(err, &de) && len(de.Fields) > 0 {
		parts := make([]string, 0, len(de.Fields))
		for _, f := range de.Fields {
			parts = append(parts, f.Field+": "+f.Message)
		}
		return errors.New(strings.Join(parts, "; "))
	}
	return err
}
