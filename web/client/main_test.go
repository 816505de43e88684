package client_test

import (
	"context"
	"net/http"
	"os"
	"testing"

	"github.com/idemgate/idemgate/models/modeltest"
	"github.com/idemgate/idemgate/web/client"
	"github.com/idemgate/idemgate/web/internal/servertest"
)

// dbs is the package's real databases, PostgreSQL and SQLite; every test runs a real idemgate
// server over each (no mocks).
var dbs *modeltest.Set

func TestMain(m *testing.M) { os.Exit(modeltest.Run(m, &dbs)) }

// Shorthands for the servertest helpers every test here uses.
func eachDB(t *testing.T, fn func(t *testing.T, srv *servertest.Server)) {
	servertest.Each(t, dbs.All(), fn)
}

func newClient(t *testing.T, srv *servertest.Server, opts ...client.Option) *client.Client {
	return servertest.NewClient(t, srv, opts...)
}

func ctx(t *testing.T) context.Context { return servertest.Ctx(t) }

// roundTripFunc adapts a function to http.RoundTripper, for fault-injecting transports in
// front of the real server.
type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }
