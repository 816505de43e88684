package fibermw_test

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/gofiber/fiber/v2"
	"github.com/gofiber/fiber/v2/middleware/recover"
	"github.com/idemgate/idemgate/models/modeltest"
	"github.com/idemgate/idemgate/web/client"
	"github.com/idemgate/idemgate/web/internal/servertest"
	"github.com/stretchr/testify/require"
)

// dbs is the package's real databases; every test runs a real idemgate server over them.
var dbs *modeltest.Set

func TestMain(m *testing.M) { os.Exit(modeltest.Run(m, &dbs)) }

// Shorthands for the servertest helpers every test here uses.
func eachDB(t *testing.T, fn func(t *testing.T, srv *servertest.Server)) {
	servertest.Each(t, dbs.All(), fn)
}

func newClient(t *testing.T, srv *servertest.Server, opts ...client.Option) *client.Client {
	return servertest.NewClient(t, srv, opts...)
}

func testCtx(t *testing.T) context.Context { return servertest.Ctx(t) }

// serve runs app on a real TCP port of 127.0.0.1 until the test ends and returns its base URL.
func serve(t *testing.T, app *fiber.App) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = app.Listener(ln)
	}()
	t.Cleanup(func() {
		testHTTP.CloseIdleConnections()
		_ = app.ShutdownWithTimeout(10 * time.Second)
		<-done
	})
	return "http://" + ln.Addr().String()
}

// newApp is a service with Fiber's recover middleware in front, as a real one has.
func newApp() *fiber.App {
	app := fiber.New(fiber.Config{DisableStartupMessage: true})
	app.Use(recover.New())
	return app
}

// testHTTP sends the tests' requests to the Fiber services; serve closes its idle connections
// before shutting a service down.
var testHTTP = &http.Client{Transport: http.DefaultTransport.(*http.Transport).Clone()}

// answer is one HTTP answer as a client saw it.
type answer struct {
	Status  int
	Body    string
	Header  http.Header
	Problem struct {
		Code           string `json:"code"`
		OriginalStatus int    `json:"original_status"`
		Errors         []struct {
			Field, Message string
		} `json:"errors"`
	}
}

func (a answer) replayed() bool { return a.Header.Get("Idempotent-Replayed") == "true" }

// send posts body to url with the given headers (an "Idempotency-Key" among them, usually).
func send(t *testing.T, ctx context.Context, method, url, body string, headers ...string) answer {
	t.Helper()
	a, err := trySend(ctx, method, url, body, headers...)
	require.NoError(t, err)
	return a
}

func trySend(ctx context.Context, method, url, body string, headers ...string) (answer, error) {
	req, err := http.NewRequestWithContext(ctx, method, url, strings.NewReader(body))
	if err != nil {
		return answer{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Add(headers[i], headers[i+1])
	}
	resp, err := testHTTP.Do(req)
	if err != nil {
		return answer{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return answer{}, err
	}
	a := answer{Status: resp.StatusCode, Body: string(b), Header: resp.Header}
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "application/problem+json") {
		_ = json.Unmarshal(b, &a.Problem)
	}
	return a, nil
}
