package fibermw_test

import (
	"context"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gofiber/fiber/v2"
	"github.com/google/uuid"
	"github.com/idemgate/idemgate/web/client"
	"github.com/idemgate/idemgate/web/client/fibermw"
	"github.com/idemgate/idemgate/web/internal/servertest"
	"github.com/stretchr/testify/require"
)

// Wait-and-replay, lease heartbeats and outcome_uncertain of the middleware (docs/reference.md
// §8, §11), against the real server on both databases.

func TestWaitAndReplayConcurrentDuplicate(t *testing.T) {
	eachDB(t, func(t *testing.T, srv *servertest.Server) {
		idem := newClient(t, srv)
		s := newChargeService(t, fibermw.Config{Client: idem, Wait: 30 * time.Second})
		s.hold, s.entered = make(chan struct{}), make(chan struct{}, 1)
		key := uuid.NewString()

		var wg sync.WaitGroup
		var first, second answer
		wg.Go(func() { first = send(t, testCtx(t), "POST", s.URL, chargeBody, "Idempotency-Key", key) })
		<-s.entered
		wg.Go(func() { second = send(t, testCtx(t), "POST", s.URL, chargeBody, "Idempotency-Key", key) })
		// Let the original finish only once the duplicate is waiting at idemgate (its attempt
		// is logged before it waits).
		waitUntil(t, "the duplicate attempt", func() bool {
			page, err := idem.ListAttempts(testCtx(t), client.ListAttemptsOptions{
				Key: "POST /v1/charges|" + key, Result: client.ResultDuplicate})
			return err == nil && len(page.Items) > 0
		})
		close(s.hold)
		wg.Wait()

		require.Equal(t, fiber.StatusCreated, first.Status)
		require.False(t, first.replayed())
		require.Equal(t, fiber.StatusCreated, second.Status, "the duplicate waited instead of a 409: %s", second.Body)
		require.True(t, second.replayed())
		require.Equal(t, first.Body, second.Body, "the original response, byte for byte")
		require.EqualValues(t, 1, s.charges.Load(), "charged once")
	})
}

func TestLeaseRenewedForHandlerLongerThanLease(t *testing.T) {
	eachDB(t, func(t *testing.T, srv *servertest.Server) {
		idem := newClient(t, srv)
		var handlerErr error
		app := newApp()
		// A 2-second lease rather than the 1-second minimum, so that one renew held up by a
		// loaded machine for more than about 0.67 s does not lose it (see the client's
		// TestDoHeartbeatKeepsKeyPastFirstLease).
		app.Post("/v1/reports", fibermw.New(fibermw.Config{Client: idem, TTL: time.Minute, Lease: 2 * time.Second}),
			func(c *fiber.Ctx) error {
				// Three leases long and a half; a lost lease would cancel the context.
				select {
				case <-time.After(7 * time.Second):
				case <-c.UserContext().Done():
					handlerErr = context.Cause(c.UserContext())
					return fiber.ErrServiceUnavailable
				}
				return c.Status(fiber.StatusCreated).JSON(fiber.Map{"report": "r_1"})
			})
		url := serve(t, app) + "/v1/reports"
		key := uuid.NewString()

		done := make(chan answer, 1)
		go func() { done <- send(t, testCtx(t), "POST", url, `{}`, "Idempotency-Key", key) }()
		// Past the first lease, a retry still finds the original in progress, not uncertain.
		waitUntil(t, "the handler to outlast its first lease", func() bool {
			kv, err := idem.GetKey(testCtx(t), "POST /v1/reports|"+key)
			return err == nil && kv.Operation != nil && time.Since(kv.Operation.AcquiredAt) > 4*time.Second
		})
		retry := send(t, testCtx(t), "POST", url, `{}`, "Idempotency-Key", key)
		require.Equal(t, fiber.StatusConflict, retry.Status)
		require.Equal(t, fibermw.CodeInProgress, retry.Problem.Code, "the heartbeat kept the lease")

		a := <-done
		require.NoError(t, handlerErr)
		require.Equal(t, fiber.StatusCreated, a.Status, a.Body)
		again := send(t, testCtx(t), "POST", url, `{}`, "Idempotency-Key", key)
		require.Equal(t, fiber.StatusCreated, again.Status)
		require.True(t, again.replayed())
	})
}

// roundTripFunc adapts a function to http.RoundTripper.
type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

func TestLostLeaseCancelsHandlerContext(t *testing.T) {
	eachDB(t, func(t *testing.T, srv *servertest.Server) {
		// Renews are held until the lease has lapsed at idemgate, which then refuses them
		// (lease_expired); everything else goes straight through.
		base := servertest.OwnTransport(t).Transport
		var admittedAt atomic.Int64
		slow := &http.Client{Transport: roundTripFunc(func(r *http.Request) (*http.Response, error) {
			if strings.HasSuffix(r.URL.Path, "/renew") {
				if wait := time.Until(time.Unix(0, admittedAt.Load()).Add(1500 * time.Millisecond)); wait > 0 {
					<-time.After(wait)
				}
				r = r.Clone(context.Background())
			}
			resp, err := base.RoundTrip(r)
			if err == nil && r.URL.Path == "/v1/acquire" && resp.StatusCode == http.StatusCreated {
				admittedAt.Store(time.Now().UnixNano())
			}
			return resp, err
		})}
		idem := newClient(t, srv, client.WithHTTPClient(slow))
		var cause error
		app := newApp()
		app.Post("/v1/reports", fibermw.New(fibermw.Config{Client: idem, TTL: time.Minute, Lease: time.Second}),
			func(c *fiber.Ctx) error {
				select {
				case <-time.After(20 * time.Second):
					return c.SendStatus(fiber.StatusCreated)
				case <-c.UserContext().Done():
					cause = context.Cause(c.UserContext())
					return fiber.ErrServiceUnavailable
				}
			})
		url := serve(t, app) + "/v1/reports"
		key := uuid.NewString()
		a := send(t, testCtx(t), "POST", url, `{}`, "Idempotency-Key", key)
		require.Equal(t, fiber.StatusServiceUnavailable, a.Status)
		require.ErrorIs(t, cause, client.ErrLeaseLost)
		require.ErrorIs(t, cause, client.ErrLeaseExpired)
		b := send(t, testCtx(t), "POST", url, `{}`, "Idempotency-Key", key)
		require.Equal(t, fiber.StatusConflict, b.Status, b.Body)
		require.Equal(t, fibermw.CodeOutcomeUncertain, b.Problem.Code)
	})
}

func TestUncertainKeyAnswers409NotUnavailable(t *testing.T) {
	eachDB(t, func(t *testing.T, srv *servertest.Server) {
		idem := newClient(t, srv)
		app := newApp()
		app.Post("/v1/charges", fibermw.New(fibermw.Config{Client: idem, TTL: time.Minute,
			OnExpiry: client.OnExpiryHoldUntilReconciled}), func(c *fiber.Ctx) error {
			return fiber.ErrBadGateway // the effect may have happened
		})
		url := serve(t, app) + "/v1/charges"
		key := uuid.NewString()
		a := send(t, testCtx(t), "POST", url, chargeBody, "Idempotency-Key", key)
		require.Equal(t, fiber.StatusBadGateway, a.Status)
		b := send(t, testCtx(t), "POST", url, chargeBody, "Idempotency-Key", key)
		require.Equal(t, fiber.StatusConflict, b.Status, b.Body)
		require.Equal(t, fibermw.CodeOutcomeUncertain, b.Problem.Code)
	})
}

// waitUntil polls cond every 20 ms until it holds or the step's context ends.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	c := testCtx(t)
	for !cond() {
		select {
		case <-c.Done():
			t.Fatalf("timed out waiting for %s", what)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func TestWaitAndReplayRunsAgainAfterNoEffect(t *testing.T) {
	eachDB(t, func(t *testing.T, srv *servertest.Server) {
		idem := newClient(t, srv)
		var runs atomic.Int64
		entered, release := make(chan struct{}, 1), make(chan struct{})
		app := newApp()
		app.Post("/v1/charges", fibermw.New(fibermw.Config{Client: idem, Wait: 30 * time.Second}), func(c *fiber.Ctx) error {
			if runs.Add(1) == 1 {
				entered <- struct{}{}
				<-release
				fibermw.NoEffect(c) // declined before anything happened
				return c.Status(fiber.StatusPaymentRequired).JSON(fiber.Map{"error": "declined"})
			}
			return c.Status(fiber.StatusCreated).JSON(fiber.Map{"charge": "ch_2"})
		})
		url := serve(t, app) + "/v1/charges"
		key := uuid.NewString()

		var wg sync.WaitGroup
		var first, second answer
		wg.Go(func() { first = send(t, testCtx(t), "POST", url, chargeBody, "Idempotency-Key", key) })
		<-entered
		wg.Go(func() { second = send(t, testCtx(t), "POST", url, chargeBody, "Idempotency-Key", key) })
		waitUntil(t, "the duplicate attempt", func() bool {
			page, err := idem.ListAttempts(testCtx(t), client.ListAttemptsOptions{
				Key: "POST /v1/charges|" + key, Result: client.ResultDuplicate})
			return err == nil && len(page.Items) > 0
		})
		close(release)
		wg.Wait()
		require.Equal(t, fiber.StatusPaymentRequired, first.Status)
		require.Equal(t, fiber.StatusCreated, second.Status, "the waiter ran the handler itself: %s", second.Body)
		require.False(t, second.replayed())
		require.EqualValues(t, 2, runs.Load())
	})
}
