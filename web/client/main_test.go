package client_test

import (
	"context"
	"net/http"
	"os"
	"testing"
	"time"

	"github.com/idemgate/idemgate/models/modeltest"
	"github.com/idemgate/idemgate/web/client"
	"github.com/idemgate/idemgate/web/client/internal/servertest"
	"github.com/stretchr/testify/require"
)

// dbs is the package's real databases, PostgreSQL and SQLite; every test runs a real idemgate
// server over each (no mocks).
var dbs *modeltest.Set

func TestMain(m *testing.M) { os.Exit(modeltest.Run(m, &dbs)) }

// eachDB runs fn in a parallel subtest per dialect, each with its own idemgate server.
func eachDB(t *testing.T, fn func(t *testing.T, srv *servertest.Server)) {
	t.Helper()
	for _, db := range dbs.All() {
		t.Run(string(db.Dialect), func(t *testing.T) {
			t.Parallel()
			fn(t, servertest.Start(t, db))
		})
	}
}

// newClient returns a client of srv with its tenant's API key.
func newClient(t *testing.T, srv *servertest.Server, opts ...client.Option) *client.Client {
	t.Helper()
	c, err := client.New(srv.URL, srv.APIKey, append([]client.Option{client.WithHTTPClient(ownTransport(t))}, opts...)...)
	require.NoError(t, err)
	return c
}

// ownTransport returns an HTTP client with its own connection pool, whose idle connections
// are closed when the test ends, before the servers shut down (which otherwise wait for
// them).
func ownTransport(t *testing.T) *http.Client {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr}
}

// ctx returns a context for one test step, bounded so that a hang fails instead of blocking.
func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return c
}

// roundTripFunc adapts a function to http.RoundTripper, for fault-injecting transports in
// front of the real server.
type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }
