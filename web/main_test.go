package web

import (
	"context"
	"io"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/idemgate/idemgate/models"
	"github.com/idemgate/idemgate/models/modeltest"
	"github.com/idemgate/idemgate/services"
	"github.com/stretchr/testify/require"
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
	s := New(testConfig(t, db, log))
	t.Cleanup(func() { _ = s.player.Close() }) // the Explore sandbox, if a test played one
	return s
}

// testConfig is the Config of newTestServer, for tests that change a field of it.
func testConfig(t testing.TB, db *models.DB, log *slog.Logger) Config {
	t.Helper()
	svc := services.New(db, log, services.Options{GroupAdmission: true})
	ctx, stop := context.WithCancel(context.Background())
	go svc.Awaiter.Run(ctx)
	t.Cleanup(stop)
	return Config{
		Services: svc,
		Log:      log,
		// The deadline bounds each whole request, CPU work such as bcrypt included; under -race
		// on shared cores that alone can take seconds. Tests of the deadline set their own.
		StoreTimeout: 30 * time.Second,
	}
}

// elapse lets d pass for p's tenant in db, for keys or (none named) all its keys, without
// waiting: their holds, TTLs and leases end d sooner (modeltest.Elapse). A hold acquired with
// a TTL of 1 s has expired after elapse(t, db, p, time.Second).
func elapse(t testing.TB, db *models.DB, p services.Principal, d time.Duration, keys ...string) {
	t.Helper()
	modeltest.Elapse(t, db, p.TenantID, d, keys...)
}

// elapse is elapse for the tenant of c's API key.
func (c *apiClient) elapse(db *models.DB, d time.Duration, keys ...string) {
	c.t.Helper()
	p, err := c.s.auth.Authenticate(context.Background(), c.key)
	require.NoError(c.t, err)
	elapse(c.t, db, p, d, keys...)
}
