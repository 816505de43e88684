package fibermw_test

import (
	"context"
	"net"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gofiber/fiber/v2"
	"github.com/google/uuid"
	"github.com/idemgate/idemgate/e2e/conformance"
	"github.com/idemgate/idemgate/web/client/fibermw"
	"github.com/idemgate/idemgate/web/internal/servertest"
	"github.com/stretchr/testify/require"
)

// TestConformance runs the Idempotency-Key draft's conformance suite (e2e/conformance) against
// a Fiber service guarded by fibermw, on both databases: every MUST and SHOULD passes; the
// answers to the open questions are logged.
func TestConformance(t *testing.T) {
	eachDB(t, func(t *testing.T, srv *servertest.Server) {
		// The service e2e/conformance/README.md describes, behind fibermw.
		var started atomic.Int64
		app := fiber.New(fiber.Config{DisableStartupMessage: true})
		app.Get("/orders/started", func(c *fiber.Ctx) error { return c.JSON(started.Load()) })
		app.Post("/orders", fibermw.New(fibermw.Config{Client: servertest.NewClient(t, srv),
			DocumentationURL: "https://example.com/docs/idempotency"}), func(c *fiber.Ctx) error {
			started.Add(1)
			if ms, _ := strconv.Atoi(c.Query("delay_ms")); ms > 0 {
				select { // the execution's own duration
				case <-time.After(time.Duration(ms) * time.Millisecond):
				case <-c.UserContext().Done():
				}
			}
			status := fiber.StatusCreated
			if s, err := strconv.Atoi(c.Query("status")); err == nil {
				status = s
			}
			return c.Status(status).JSON(fiber.Map{"id": uuid.NewString()})
		})
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		go func() { _ = app.Listener(ln) }()
		t.Cleanup(func() { _ = app.ShutdownWithTimeout(5 * time.Second) })

		cases, err := conformance.Cases()
		require.NoError(t, err)
		results := conformance.Run(context.Background(), "http://"+ln.Addr().String(), servertest.OwnTransport(t), cases)
		t.Logf("conformance report:\n%s", conformance.Report(results))
		for _, r := range results {
			if r.Case.Level != conformance.LevelOpen {
				require.True(t, r.Pass, "%s %s: %v", r.Case.Level, r.Case.ID, r.Problems)
			}
		}
	})
}
