package cli

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"runtime/debug"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemgate/idemgate/internal/testkit"
	"github.com/idemgate/idemgate/models"
	"github.com/idemgate/idemgate/services"
	"github.com/stretchr/testify/require"
)

// startServe runs `idemgate serve` in process on a port the kernel picks, waits until it logs
// that it listens, and returns its log and a function that stops it and returns its error.
func startServe(t *testing.T, vars map[string]string) (*testkit.Log, func() error) {
	t.Helper()
	v := map[string]string{"IDEMGATE_ADDR": "127.0.0.1:0"}
	for k, val := range vars {
		v[k] = val
	}
	log := &testkit.Log{}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- Execute(ctx, []string{"serve"}, Env{Getenv: env(v), Stdin: strings.NewReader(""), Stdout: log, Stderr: log})
	}()
	deadline := time.After(30 * time.Second)
	for !strings.Contains(log.String(), `"msg":"listening on http://127.0.0.1:`) {
		select {
		case err := <-done:
			cancel()
			t.Fatalf("serve stopped before listening: %v\n%s", err, log)
		case <-deadline:
			cancel()
			t.Fatalf("serve did not listen within 30 s:\n%s", log)
		case <-time.After(10 * time.Millisecond):
		}
	}
	var once sync.Once
	var err error
	stop := func() error {
		once.Do(func() { cancel(); err = <-done })
		return err
	}
	t.Cleanup(func() { _ = stop() })
	return log, stop
}

// migrated reports whether vars' database has been migrated (goose's version table exists).
func migrated(t *testing.T, vars map[string]string) bool {
	t.Helper()
	if vars["DATABASE_URL"] == "" {
		_, err := os.Stat(vars["IDEMGATE_SQLITE_PATH"])
		return err == nil
	}
	db, err := models.Open(context.Background(), models.OpenOptions{DatabaseURL: vars["DATABASE_URL"]})
	require.NoError(t, err)
	defer db.Close()
	var n int64
	require.NoError(t, db.Raw("SELECT count(*) FROM information_schema.tables WHERE table_name = 'goose_db_version'").Scan(&n).Error)
	return n > 0
}

// TestServeRefusesABusyPortBeforeMigrating: with IDEMGATE_ADDR held by another listener, serve
// fails naming the variable and the cause, and has neither migrated the database nor created
// (and printed) the one-time bootstrap secrets.
func TestServeRefusesABusyPortBeforeMigrating(t *testing.T) {
	eachDialect(t, func(t *testing.T, vars map[string]string) {
		busy, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		defer busy.Close()
		vars["IDEMGATE_ADDR"] = busy.Addr().String()
		out, errOut, err := run(t, vars, "", "serve")
		require.ErrorContains(t, err, "IDEMGATE_ADDR="+busy.Addr().String())
		require.ErrorContains(t, err, "address already in use")
		require.False(t, migrated(t, vars), "serve migrated the database before it could listen")
		require.NotContains(t, out+errOut, "shown only once")
		require.NotContains(t, out+errOut, "idg_")
	})
}

// TestServeMissingSQLiteDirectory: a SQLite path in a directory that does not exist is named
// as such (the driver alone says "out of memory (14)"), for serve and the other commands.
func TestServeMissingSQLiteDirectory(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "no", "such")
	vars := map[string]string{"IDEMGATE_SQLITE_PATH": filepath.Join(dir, "idemgate.db"), "IDEMGATE_ADDR": "127.0.0.1:0", "IDEMGATE_LOG_FORMAT": "json"}
	for _, args := range [][]string{{"serve"}, {"migrate"}, {"operator", "list"}, {"tenant", "list"}} {
		_, _, err := run(t, vars, "", args...)
		require.ErrorContains(t, err, "directory "+dir+" does not exist", "%v", args)
		require.NotContains(t, err.Error(), "out of memory", "%v", args)
	}
	file := filepath.Join(t.TempDir(), "plain")
	require.NoError(t, os.WriteFile(file, nil, 0o600))
	vars["IDEMGATE_SQLITE_PATH"] = filepath.Join(file, "idemgate.db")
	_, _, err := run(t, vars, "", "migrate")
	require.ErrorContains(t, err, "is not a directory")
}

// TestServeWarnsThatAdminPasswordIsIgnored: IDEMGATE_ADMIN_PASSWORD seeds only the first
// admin; on a later start with accounts present serve says it is ignored and how to change a
// password, and the account keeps its password. IDEMGATE_BOOTSTRAP_API_KEY likewise: set only
// on a later start, serve says it is ignored (a user found it silently answered 401).
func TestServeWarnsThatAdminPasswordIsIgnored(t *testing.T) {
	eachDialect(t, func(t *testing.T, vars map[string]string) {
		vars["IDEMGATE_ADMIN_PASSWORD"] = "the-first-password"
		log, stop := startServe(t, vars)
		require.NoError(t, stop())
		require.Contains(t, log.String(), "created dashboard account 'admin' with IDEMGATE_ADMIN_PASSWORD")
		require.NotContains(t, log.String(), "is ignored")

		vars["IDEMGATE_ADMIN_PASSWORD"] = "a-changed-password"
		vars["IDEMGATE_BOOTSTRAP_API_KEY"] = "idg_a_later_key_0123456789abcdef"
		log, stop = startServe(t, vars)
		require.NoError(t, stop())
		require.Contains(t, log.String(), "IDEMGATE_ADMIN_PASSWORD is ignored: dashboard accounts exist already")
		require.Contains(t, log.String(), "IDEMGATE_BOOTSTRAP_API_KEY is ignored: API keys exist already")
		require.Contains(t, log.String(), "idemgate operator passwd USERNAME")
		require.NotContains(t, log.String(), "a-changed-password", "the password is never logged")
		require.NotContains(t, log.String(), "idg_a_later_key", "the key is never logged")

		db, err := models.Open(context.Background(), models.OpenOptions{DatabaseURL: vars["DATABASE_URL"], SQLitePath: vars["IDEMGATE_SQLITE_PATH"]})
		require.NoError(t, err)
		defer db.Close()
		auth := services.NewAuth(db, nil)
		_, err = auth.Login(context.Background(), "admin", "a-changed-password")
		require.ErrorIs(t, err, services.ErrUnauthorized)
		_, err = auth.Login(context.Background(), "admin", "the-first-password")
		require.NoError(t, err)
	})
}

// TestServeLogsWhereItListens: the line a newcomer waits for says the address, also for a
// port the kernel chose.
func TestServeLogsWhereItListens(t *testing.T) {
	vars := map[string]string{"IDEMGATE_SQLITE_PATH": filepath.Join(t.TempDir(), "cli.db"), "IDEMGATE_LOG_FORMAT": "json"}
	log, stop := startServe(t, vars)
	require.NotContains(t, log.String(), "http://127.0.0.1:0")
	require.NoError(t, stop())
}

// TestApplyGOGC: serve raises the collector's target only when GOGC is not set; an operator's
// GOGC (the runtime read it at start) is left alone.
func TestApplyGOGC(t *testing.T) {
	before := debug.SetGCPercent(100)
	t.Cleanup(func() { debug.SetGCPercent(before) })
	applyGOGC(func(string) string { return "" })
	require.Equal(t, serveGOGC, debug.SetGCPercent(100))
	applyGOGC(func(k string) string {
		if k == "GOGC" {
			return "100"
		}
		return ""
	})
	require.Equal(t, 100, debug.SetGCPercent(100))
}
