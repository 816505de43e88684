package models

import (
	"github.com/XSAM/otelsql"
	"github.com/exaring/otelpgx"
	"github.com/glebarez/sqlite"
	"go.opentelemetry.io/otel/metric/noop"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"
	"gorm.io/gorm"
)

// pgxTracer is the pgx tracer of OpenOptions.TracerProvider: a span per query, batch, copy,
// prepare, connect and pool acquire, named by the SQL operation (SELECT, INSERT, …) with the
// statement in db.query.text. Query parameters are left out (otelpgx records them only when
// asked to): they are keys, owner-token digests and session ids. Metrics are not exported:
// /metrics already has the pool's (idemgate_db_pool_*).
func pgxTracer(tp trace.TracerProvider) *otelpgx.Tracer {
	return otelpgx.NewTracer(otelpgx.WithTracerProvider(tp), otelpgx.WithMeterProvider(noop.NewMeterProvider()))
}

// openSQLite is GORM's SQLite dialector for opts: the plain driver, or with
// opts.TracerProvider the same driver wrapped by otelsql, which starts a span per statement
// (db.query.text, never the arguments: otelsql does not record them). Spans for result-set
// iteration, prepares and connection resets are left out: per-statement spans are what a
// trace of a request needs, and those others would triple the span count. The wrapped pool is
// opened lazily, as sql.Open does: only an unknown driver fails here.
func openSQLite(opts OpenOptions) (gorm.Dialector, error) {
	dsn := sqliteDSN(opts.SQLitePath, opts.StoreTimeout)
	if opts.TracerProvider == nil {
		return sqlite.Open(dsn), nil
	}
	conn, err := otelsql.Open(sqlite.DriverName, dsn,
		otelsql.WithTracerProvider(opts.TracerProvider), otelsql.WithMeterProvider(noop.NewMeterProvider()),
		otelsql.WithAttributes(semconv.DBSystemNameSQLite),
		otelsql.WithSpanOptions(otelsql.SpanOptions{OmitConnResetSession: true, OmitRows: true,
			OmitConnPrepare: true, DisableErrSkip: true}))
	if err != nil {
		return nil, err
	}
	return &sqlite.Dialector{DriverName: sqlite.DriverName, DSN: dsn, Conn: conn}, nil
}
