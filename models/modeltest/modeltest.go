// Package modeltest gives a test package a real, freshly migrated database of each dialect:
// a PostgreSQL database created for the package and dropped after it, and an SQLite file in a
// temporary directory. There is no mock: if PostgreSQL cannot be reached the package fails
// loudly; it never skips.
package modeltest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/idemgate/idemgate/models"
	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"
)

// DefaultAdminURL is the PostgreSQL server used when TEST_DATABASE_URL is unset: the local
// server of README.md's test setup (trust auth, user postgres).
const DefaultAdminURL = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"

// Set is the package's databases, one per dialect. PostgresURL is the URL of the package's own
// PostgreSQL database (for starting server processes against it).
type Set struct {
	Postgres    *models.DB
	SQLite      *models.DB
	PostgresURL string
	SQLitePath  string
}

// All returns the databases in a fixed order, PostgreSQL first.
func (s *Set) All() []*models.DB { return []*models.DB{s.Postgres, s.SQLite} }

// Each runs fn as a subtest per database of dbs, named after its dialect ("postgres",
// "sqlite"), in order: the one way this repository's tests run on every database. fn may call
// t.Parallel.
func Each(t *testing.T, dbs []*models.DB, fn func(t *testing.T, db *models.DB)) {
	t.Helper()
	for _, db := range dbs {
		t.Run(string(db.Dialect), func(t *testing.T) { fn(t, db) })
	}
}

// Each is Each over the set's databases, PostgreSQL first.
func (s *Set) Each(t *testing.T, fn func(t *testing.T, db *models.DB)) {
	t.Helper()
	Each(t, s.All(), fn)
}

// AdminURL returns TEST_DATABASE_URL or DefaultAdminURL.
func AdminURL() string {
	if u := os.Getenv("TEST_DATABASE_URL"); u != "" {
		return u
	}
	return DefaultAdminURL
}

// Run creates the databases, stores them in *set, runs the package's tests and drops the
// PostgreSQL database. Use it from TestMain: os.Exit(modeltest.Run(m, &set)).
func Run(m *testing.M, set **Set) int {
	s, cleanup, err := create()
	if err != nil {
		fmt.Fprintf(os.Stderr, "\nFAIL: cannot prepare test databases: %v\n"+
			"The tests need PostgreSQL (TEST_DATABASE_URL, default %s); `make test` starts it.\n\n", err, DefaultAdminURL)
		return 1
	}
	*set = s
	code := m.Run()
	cleanup()
	return code
}

// CreatePostgres creates an empty PostgreSQL database and returns its URL and a function that
// drops it (terminating leftover connections first).
func CreatePostgres() (string, func(), error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	admin, err := gorm.Open(postgres.Open(AdminURL()), &gorm.Config{Logger: logger.Discard})
	if err != nil {
		return "", nil, fmt.Errorf("connect to %s: %w", AdminURL(), err)
	}
	adminSQL, _ := admin.DB()
	if err := adminSQL.PingContext(ctx); err != nil {
		return "", nil, fmt.Errorf("connect to %s: %w", AdminURL(), err)
	}
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	name := "idemgate_test_" + hex.EncodeToString(b)
	if err := admin.WithContext(ctx).Exec("CREATE DATABASE " + name).Error; err != nil {
		return "", nil, fmt.Errorf("create database %s: %w", name, err)
	}
	u, err := url.Parse(AdminURL())
	if err != nil {
		return "", nil, err
	}
	u.Path = "/" + name
	drop := func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = admin.WithContext(ctx).Exec("DROP DATABASE IF EXISTS " + name + " WITH (FORCE)").Error
		_ = adminSQL.Close()
	}
	return u.String(), drop, nil
}

func create() (*Set, func(), error) {
	ctx := context.Background()
	pgURL, drop, err := CreatePostgres()
	if err != nil {
		return nil, nil, err
	}
	dir, err := os.MkdirTemp("", "idemgate-test-")
	if err != nil {
		drop()
		return nil, nil, err
	}
	s := &Set{PostgresURL: pgURL, SQLitePath: filepath.Join(dir, "test.db")}
	cleanup := func() {
		if s.Postgres != nil {
			_ = s.Postgres.Close()
		}
		if s.SQLite != nil {
			_ = s.SQLite.Close()
		}
		drop()
		_ = os.RemoveAll(dir)
	}
	for _, o := range []struct {
		opts models.OpenOptions
		dst  **models.DB
	}{
		{models.OpenOptions{DatabaseURL: pgURL, MaxConns: 16}, &s.Postgres},
		{models.OpenOptions{SQLitePath: s.SQLitePath}, &s.SQLite},
	} {
		db, err := models.Open(ctx, o.opts)
		if err != nil {
			cleanup()
			return nil, nil, err
		}
		*o.dst = db
		if _, err := models.Migrate(ctx, db, nil); err != nil {
			cleanup()
			return nil, nil, err
		}
	}
	if err := checkMajor(ctx, s.Postgres); err != nil {
		cleanup()
		return nil, nil, err
	}
	return s, cleanup, nil
}

// checkMajor makes sure that the server is the PostgreSQL major version TEST_POSTGRES_MAJOR
// names, when it is set (.ci/pgversions.sh sets it), so a run meant for 17 or 18 that reached
// another server fails instead of passing on the wrong one.
func checkMajor(ctx context.Context, db *models.DB) error {
	want := os.Getenv("TEST_POSTGRES_MAJOR")
	if want == "" {
		return nil
	}
	var num int
	if err := db.Pool.QueryRow(ctx, "SELECT current_setting('server_version_num')::int").Scan(&num); err != nil {
		return err
	}
	if got := strconv.Itoa(num / 10000); got != want {
		return fmt.Errorf("TEST_POSTGRES_MAJOR=%s but %s runs PostgreSQL %s (server_version_num %d)", want, AdminURL(), got, num)
	}
	return nil
}

// Fresh returns a new, migrated PostgreSQL database and SQLite file that only the calling test
// uses (both dropped or removed after it), PostgreSQL first, for assertions over every row of
// the installation (the last-admin rule counts every account, the reaper and the
// reconciliation gauge see every tenant) that other tests of the package would disturb.
func Fresh(tb testing.TB) []*models.DB {
	tb.Helper()
	ctx := context.Background()
	pgURL, drop, err := CreatePostgres()
	if err != nil {
		tb.Fatalf("fresh databases: %v", err)
	}
	tb.Cleanup(drop)
	var out []*models.DB
	for _, opts := range []models.OpenOptions{
		{DatabaseURL: pgURL, MaxConns: 16},
		{SQLitePath: filepath.Join(tb.TempDir(), "fresh.db")},
	} {
		db, err := models.Open(ctx, opts)
		if err != nil {
			tb.Fatalf("fresh databases: %v", err)
		}
		tb.Cleanup(func() { _ = db.Close() })
		if _, err := models.Migrate(ctx, db, nil); err != nil {
			tb.Fatalf("fresh databases: migrate %s: %v", db.Dialect, err)
		}
		out = append(out, db)
	}
	return out
}

// Tenant creates a tenant with a unique name in db and returns its id, so tests sharing the
// package database never see each other's keys.
func Tenant(tb testing.TB, db *models.DB) int64 {
	tb.Helper()
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	t := models.Tenant{Name: "t-" + hex.EncodeToString(b), CreatedAt: time.Now().UTC()}
	// Through Write: on SQLite it waits its turn at the write lock instead of polling for it in
	// the busy handler, where a parallel test's long batches starved it past the busy timeout
	// ("create tenant: database is locked", CI).
	err := db.Write(context.Background(), func(w *gorm.DB) error { return w.Create(&t).Error })
	if err != nil {
		tb.Fatalf("create tenant: %v", err)
	}
	return t.ID
}
