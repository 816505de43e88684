package web

import (
	"io"
	"log/slog"
	"os"
	"testing"

	"github.com/idemgate/idemgate/models"
	"github.com/idemgate/idemgate/models/modeltest"
	"github.com/idemgate/idemgate/services"
)

// dbs is the package's real databases, PostgreSQL and SQLite (no mocks).
var dbs *modeltest.Set

func TestMain(m *testing.M) { os.Exit(modeltest.Run(m, &dbs)) }

// newTestServer builds the whole HTTP layer over db with real services, as cli/serve.go does,
// logging nowhere.
func newTestServer(t *testing.T, db *models.DB) *Server {
	t.Helper()
	return newLoggingTestServer(t, db, slog.New(slog.NewTextHandler(io.Discard, nil)))
}

// newLoggingTestServer is newTestServer logging to log.
func newLoggingTestServer(t *testing.T, db *models.DB, log *slog.Logger) *Server {
	t.Helper()
	sqlDB, err := db.SQL()
	if err != nil {
		t.Fatalf("sql DB: %v", err)
	}
	return New(Config{
		Admission: services.NewAdmission(db, log, 0),
		Auth:      services.NewAuth(db, log),
		Log:       log,
		DB:        sqlDB,
		Pool:      db.Pool,
		Sessions:  NewSessionStorage(db),
	})
}
