// Package servertest starts a real idemgate server (web.New over real services and a real
// database) on a loopback port, for the tests of the client (web/client) and its middleware
// (web/client/fibermw). It is a server test kit, so it sits with the server under web/; being
// internal, only packages under web/ can import it, and only those tests do, so importing the
// client never pulls in the server, GORM or a database driver.
package servertest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"testing"
	"time"

	"github.com/idemgate/idemgate/internal/testkit"
	"github.com/idemgate/idemgate/models"
	"github.com/idemgate/idemgate/models/modeltest"
	"github.com/idemgate/idemgate/services"
	"github.com/idemgate/idemgate/web"
	"github.com/idemgate/idemgate/web/client"
)

// Server is a running idemgate server.
type Server struct {
	// URL is the base URL, "http://127.0.0.1:<port>".
	URL string
	// APIKey is the API key of a tenant created for this server.
	APIKey string
	// DB is the database the server uses.
	DB *models.DB
	// Accounts creates API keys (NewAPIKey).
	Accounts *services.Accounts
}

// Start serves a new idemgate server over db on 127.0.0.1:0 until the test ends, with a fresh
// tenant and API key, so tests sharing a database never see each other's keys.
func Start(tb testing.TB, db *models.DB) *Server {
	tb.Helper()
	s, stop, err := StartServer(db)
	if err != nil {
		tb.Fatalf("start idemgate: %v", err)
	}
	tb.Cleanup(stop)
	return s
}

// StartServer is Start for callers without a testing.TB (examples): it returns the server and
// the function that stops it.
func StartServer(db *models.DB) (*Server, func(), error) {
	log := slog.New(slog.DiscardHandler)
	if os.Getenv("IDEMGATE_TEST_LOG") != "" {
		log = slog.New(slog.NewTextHandler(os.Stderr, nil))
	}
	svc := services.New(db, log, services.Options{})
	srv := web.New(web.Config{Services: svc, Log: log})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, nil, err
	}
	awaitCtx, stopAwait := context.WithCancel(context.Background())
	go svc.Awaiter.Run(awaitCtx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(ln)
	}()
	stop := func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
		<-done
		stopAwait()
	}
	s := &Server{URL: "http://" + ln.Addr().String(), DB: db, Accounts: svc.Accounts}
	if s.APIKey, err = s.createAPIKey(); err != nil {
		stop()
		return nil, nil, err
	}
	return s, stop, nil
}

// Elapse lets d pass for keys (all when none are named) of the tenant of s's APIKey, without
// waiting: their holds, TTLs and leases end d sooner (modeltest.Elapse).
func (s *Server) Elapse(tb testing.TB, d time.Duration, keys ...string) {
	tb.Helper()
	p, err := services.NewAuth(s.DB, nil).Authenticate(context.Background(), s.APIKey)
	if err != nil {
		tb.Fatalf("elapse: authenticate: %v", err)
	}
	modeltest.Elapse(tb, s.DB, p.TenantID, d, keys...)
}

// NewAPIKey creates an API key of a new tenant and returns its secret.
func (s *Server) NewAPIKey(tb testing.TB) string {
	tb.Helper()
	key, err := s.createAPIKey()
	if err != nil {
		tb.Fatalf("create API key: %v", err)
	}
	return key
}

func (s *Server) createAPIKey() (string, error) {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return s.Accounts.CreateAPIKey(context.Background(), services.Installation(), "t-"+hex.EncodeToString(b), "test", "")
}

// OpenThrough opens a second connection pool to the PostgreSQL database at pgURL through a
// Proxy, so a test can cut the server off its database and reconnect it.
func OpenThrough(tb testing.TB, pgURL string, p *Proxy) *models.DB {
	tb.Helper()
	u, err := url.Parse(p.Via(tb, pgURL))
	if err != nil {
		tb.Fatalf("parse %s: %v", pgURL, err)
	}
	q := u.Query()
	q.Set("connect_timeout", "2")
	u.RawQuery = q.Encode()
	db, err := models.Open(context.Background(), models.OpenOptions{DatabaseURL: u.String(), MaxConns: 4})
	if err != nil {
		tb.Fatalf("open through proxy: %v", err)
	}
	tb.Cleanup(func() { _ = db.Close() })
	return db
}

// Proxy is a TCP forwarder that can be switched off (every connection cut, new ones closed
// at once) and on again: a real network failure between idemgate and its database.
type Proxy = testkit.Proxy

// NewProxy listens on 127.0.0.1:0 until the test ends. OpenThrough sets its target.
func NewProxy(tb testing.TB) *Proxy { return testkit.NewProxy(tb, "") }

// Each runs fn in a parallel subtest per database of dbs, each with its own idemgate server.
func Each(t *testing.T, dbs []*models.DB, fn func(t *testing.T, srv *Server)) {
	t.Helper()
	modeltest.Each(t, dbs, func(t *testing.T, db *models.DB) {
		t.Parallel()
		fn(t, Start(t, db))
	})
}

// NewClient returns a client of srv with its tenant's API key and a connection pool of its
// own (OwnTransport); opts come after, so they may replace it.
func NewClient(t *testing.T, srv *Server, opts ...client.Option) *client.Client {
	t.Helper()
	c, err := client.New(srv.URL, srv.APIKey, append([]client.Option{client.WithHTTPClient(OwnTransport(t))}, opts...)...)
	if err != nil {
		t.Fatalf("client.New: %v", err)
	}
	return c
}

// OwnTransport returns an HTTP client with its own connection pool, whose idle connections
// are closed when the test ends, before the servers shut down (which otherwise wait for
// them).
func OwnTransport(t *testing.T) *http.Client {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr}
}

// Ctx returns a context for one test step, bounded by a minute so that a hang fails the test
// instead of blocking it.
func Ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return c
}
