package fibermw_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gofiber/fiber/v2"
	"github.com/google/uuid"
	"github.com/idemgate/idemgate/internal/testkit"
	"github.com/idemgate/idemgate/web/client"
	"github.com/idemgate/idemgate/web/client/fibermw"
	"github.com/idemgate/idemgate/web/internal/servertest"
	"github.com/stretchr/testify/require"
)

const chargeBody = `{"amount":1200,"currency":"EUR","order":"o-5521"}`

// chargeService is a Fiber service whose POST /v1/charges "charges" (counts) once per run.
type chargeService struct {
	URL     string
	charges atomic.Int64
	// hold, when set, is waited on inside the handler (after entered is signalled).
	hold    chan struct{}
	entered chan struct{}
}

func newChargeService(t *testing.T, cfg fibermw.Config) *chargeService {
	s := &chargeService{}
	app := newApp()
	app.Post("/v1/charges", fibermw.New(cfg), func(c *fiber.Ctx) error {
		n := s.charges.Add(1)
		if s.entered != nil {
			s.entered <- struct{}{}
		}
		if s.hold != nil {
			<-s.hold
		}
		info, _ := fibermw.FromContext(c)
		fibermw.SetReceipt(c, fmt.Sprintf("ch_%d", n))
		c.Location("/v1/charges/ch_" + strconv.FormatInt(n, 10))
		c.Cookie(&fiber.Cookie{Name: "session", Value: "secret"})
		return c.Status(fiber.StatusCreated).JSON(fiber.Map{"charge": fmt.Sprintf("ch_%d", n),
			"fencing_token": info.FencingToken, "note": "<ok> & done"})
	})
	s.URL = serve(t, app) + "/v1/charges"
	return s
}

func TestConcurrentRetriesChargeOnce(t *testing.T) {
	eachDB(t, func(t *testing.T, srv *servertest.Server) {
		var retries atomic.Int64
		idem := newClient(t, srv, client.WithRetryNotify(func(e client.RetryEvent) {
			retries.Add(1)
			t.Logf("idemgate retry: %s try %d after %v: %v", e.Path, e.Try, e.Delay, e.Err)
		}))
		s := newChargeService(t, fibermw.Config{Client: idem})
		s.hold, s.entered = make(chan struct{}), make(chan struct{}, 1)
		key := uuid.NewString()
		const workers = 32

		var (
			firstAnswers   sync.WaitGroup // every worker but the admitted one got its 409
			originalDone   = make(chan struct{})
			originalOnce   sync.Once
			mu             sync.Mutex
			final          []answer
			inProgressSeen int
		)
		firstAnswers.Add(workers - 1)
		var wg sync.WaitGroup
		for range workers {
			wg.Go(func() {
				first := true
				for {
					a, err := trySend(testCtx(t), "POST", s.URL, chargeBody, "Idempotency-Key", key)
					if err != nil {
						t.Error(err)
						return
					}
					if a.Status == fiber.StatusConflict {
						// Still running: the answer says so and when to come back.
						if a.Problem.Code != fibermw.CodeInProgress || a.Header.Get("Retry-After") != "1" {
							t.Errorf("409 without request_in_progress and Retry-After: %+v", a)
						}
						mu.Lock()
						inProgressSeen++
						mu.Unlock()
						if first {
							first = false
							firstAnswers.Done()
						}
						<-originalDone
						continue
					}
					if !a.replayed() {
						originalOnce.Do(func() { close(originalDone) })
					}
					mu.Lock()
					final = append(final, a)
					mu.Unlock()
					return
				}
			})
		}
		<-s.entered         // the admitted request is inside the handler…
		firstAnswers.Wait() // …and every other one was told it is in progress
		close(s.hold)
		wg.Wait()

		require.EqualValues(t, 1, s.charges.Load(), "exactly one charge")
		require.GreaterOrEqual(t, inProgressSeen, workers-1)
		require.Len(t, final, workers)
		var original answer
		originals := 0
		for _, a := range final {
			if !a.replayed() {
				original = a
				originals++
			}
		}
		require.Equal(t, 1, originals, "one original response, the rest replays")
		require.Equal(t, fiber.StatusCreated, original.Status)
		require.Contains(t, original.Body, `"charge":"ch_1"`)
		for _, a := range final {
			require.Equal(t, original.Status, a.Status)
			require.Equal(t, original.Body, a.Body, "replayed byte for byte")
			require.Equal(t, original.Header.Get("Content-Type"), a.Header.Get("Content-Type"))
			require.Equal(t, "/v1/charges/ch_1", a.Header.Get("Location"))
			if a.replayed() {
				require.Empty(t, a.Header.Get("Set-Cookie"), "cookies are never replayed")
			}
		}

		// After completion: another burst, all replays, all identical.
		var burst sync.WaitGroup
		for range workers {
			burst.Go(func() {
				a, err := trySend(testCtx(t), "POST", s.URL, chargeBody, "Idempotency-Key", key)
				if err != nil {
					t.Error(err)
					return
				}
				if a.Status != original.Status || a.Body != original.Body || !a.replayed() {
					t.Errorf("not an identical replay: %+v", a)
				}
			})
		}
		burst.Wait()
		require.EqualValues(t, 1, s.charges.Load())

		kv, err := idem.GetKey(testCtx(t), "POST /v1/charges|"+key)
		require.NoError(t, err)
		require.Equal(t, client.StateSucceeded, kv.Operation.State)
		require.Equal(t, "ch_1", kv.Operation.Outcome.Receipt)
		require.GreaterOrEqual(t, kv.Operation.DuplicateAttempts, int64(2*workers-1))
	})
}

func TestKeyRules(t *testing.T) {
	srv := servertest.Start(t, dbs.Postgres)
	s := newChargeService(t, fibermw.Config{Client: newClient(t, srv)})
	ctx := testCtx(t)

	a := send(t, ctx, "POST", s.URL, chargeBody)
	require.Equal(t, 400, a.Status, "a guarded route requires the key")
	require.Equal(t, fibermw.CodeKeyMissing, a.Problem.Code)
	require.Equal(t, "application/problem+json", a.Header.Get("Content-Type"))

	for _, v := range []string{strings.Repeat("k", fibermw.MaxKeyBytes+1), `"unterminated`, `"bad \n escape"`, `"é"`, "   "} {
		a = send(t, ctx, "POST", s.URL, chargeBody, "Idempotency-Key", v)
		require.Equal(t, 400, a.Status, "%q", v)
		require.Equal(t, fibermw.CodeKeyInvalid, a.Problem.Code, "%q", v)
		require.Equal(t, "Idempotency-Key", a.Problem.Errors[0].Field)
	}
	a = send(t, ctx, "POST", s.URL, chargeBody, "Idempotency-Key", "a", "Idempotency-Key", "b")
	require.Equal(t, 400, a.Status, "the draft allows one key per request")
	require.Zero(t, s.charges.Load(), "nothing ran")

	// A structured-field string and the bare value are the same key; the header name is
	// case-insensitive; the value is byte-exact.
	key := uuid.NewString()
	a = send(t, ctx, "POST", s.URL, chargeBody, "idempotency-key", `"`+key+`"`)
	require.Equal(t, 201, a.Status)
	b := send(t, ctx, "POST", s.URL, chargeBody, "IDEMPOTENCY-KEY", key)
	require.True(t, b.replayed())
	require.Equal(t, a.Body, b.Body)
	c := send(t, ctx, "POST", s.URL, chargeBody, "Idempotency-Key", strings.ToUpper(key))
	require.Equal(t, 201, c.Status, "keys are case-sensitive")
	require.False(t, c.replayed())
	require.EqualValues(t, 2, s.charges.Load())
}

func TestFingerprint(t *testing.T) {
	eachDB(t, func(t *testing.T, srv *servertest.Server) {
		s := newChargeService(t, fibermw.Config{Client: newClient(t, srv)})
		ctx := testCtx(t)
		key := uuid.NewString()
		a := send(t, ctx, "POST", s.URL, chargeBody, "Idempotency-Key", key, "Authorization", "Bearer alice")
		require.Equal(t, 201, a.Status)

		// The same JSON spelled differently is the same request (canonical form).
		same := "{ \"order\": \"o-5521\",\n \"currency\": \"EUR\", \"amount\": 12e2 }"
		b := send(t, ctx, "POST", s.URL, same, "Idempotency-Key", key, "Authorization", "Bearer alice")
		require.True(t, b.replayed())
		require.Equal(t, a.Body, b.Body)

		for name, req := range map[string][]string{
			"other body":   {"POST", s.URL, `{"amount":9999,"currency":"EUR","order":"o-5521"}`, "Bearer alice"},
			"other query":  {"POST", s.URL + "?dry_run=1", chargeBody, "Bearer alice"},
			"other caller": {"POST", s.URL, chargeBody, "Bearer mallory"},
		} {
			c := send(t, ctx, req[0], req[1], req[2], "Idempotency-Key", key, "Authorization", req[3])
			require.Equal(t, 422, c.Status, name)
			require.Equal(t, fibermw.CodeFingerprintMismatch, c.Problem.Code, name)
		}
		require.EqualValues(t, 1, s.charges.Load())
	})
}

// Numbers in a JSON body are compared exactly: two amounts that are the same float64 are
// still two different requests (RFC 8785's double reading would replay the first).
func TestFingerprintComparesNumbersExactly(t *testing.T) {
	eachDB(t, func(t *testing.T, srv *servertest.Server) {
		s := newChargeService(t, fibermw.Config{Client: newClient(t, srv)})
		ctx := testCtx(t)
		for _, pair := range [][2]string{
			{`{"amount":9007199254740993}`, `{"amount":9007199254740992}`},
			{`{"amount":0.1}`, `{"amount":0.10000000000000001}`},
			{`{"amount":1e400}`, `{"amount":2e400}`},
			{`{"amount":123456789012345678901234567890}`, `{"amount":123456789012345678901234567891}`},
		} {
			key := uuid.NewString()
			a := send(t, ctx, "POST", s.URL, pair[0], "Idempotency-Key", key, "Authorization", "Bearer alice")
			require.Equal(t, 201, a.Status, pair[0])
			b := send(t, ctx, "POST", s.URL, pair[1], "Idempotency-Key", key, "Authorization", "Bearer alice")
			require.Equal(t, 422, b.Status, "%s after %s replayed the first response", pair[1], pair[0])
			require.Equal(t, fibermw.CodeFingerprintMismatch, b.Problem.Code)
			// The same value spelled otherwise is still the same request.
			c := send(t, ctx, "POST", s.URL, strings.Replace(pair[0], ":", ": ", 1), "Idempotency-Key", key, "Authorization", "Bearer alice")
			require.True(t, c.replayed(), pair[0])
		}
		require.EqualValues(t, 4, s.charges.Load())
	})
}

// statusService answers with the status its request asks for, after running the effect.
func statusService(t *testing.T, cfg fibermw.Config, runs *atomic.Int64, handler func(c *fiber.Ctx, n int64) error) string {
	app := newApp()
	app.Post("/op", fibermw.New(cfg), func(c *fiber.Ctx) error {
		return handler(c, runs.Add(1))
	})
	return serve(t, app) + "/op"
}

func TestServerErrorIsUncertain(t *testing.T) {
	eachDB(t, func(t *testing.T, srv *servertest.Server) {
		idem := newClient(t, srv)
		var runs atomic.Int64
		var opID string
		url := statusService(t, fibermw.Config{Client: idem}, &runs, func(c *fiber.Ctx, n int64) error {
			info, _ := fibermw.FromContext(c)
			opID = info.OperationID
			if strings.Contains(c.Query("mode"), "error") {
				return fiber.NewError(fiber.StatusBadGateway, "upstream timed out") // via the app's error handler
			}
			return c.Status(fiber.StatusInternalServerError).JSON(fiber.Map{"error": "boom"})
		})
		ctx := testCtx(t)
		for _, mode := range []string{"status", "error"} {
			key := uuid.NewString()
			u := url + "?mode=" + mode
			a := send(t, ctx, "POST", u, `{}`, "Idempotency-Key", key)
			require.GreaterOrEqual(t, a.Status, 500, mode)
			d, err := idem.GetOperation(ctx, opID)
			require.NoError(t, err)
			require.Equal(t, client.StateUncertain, d.State, "%s: a 5xx may hide an effect", mode)
			require.True(t, d.Held, "never released automatically")

			b := send(t, ctx, "POST", u, `{}`, "Idempotency-Key", key)
			require.Equal(t, 409, b.Status)
			require.Equal(t, fibermw.CodeOutcomeUncertain, b.Problem.Code)
		}
		require.EqualValues(t, 2, runs.Load(), "retries never ran the handler")
	})
}

func TestNoEffectLetsTheRetryRun(t *testing.T) {
	eachDB(t, func(t *testing.T, srv *servertest.Server) {
		idem := newClient(t, srv)
		var runs atomic.Int64
		url := statusService(t, fibermw.Config{Client: idem}, &runs, func(c *fiber.Ctx, n int64) error {
			if n == 1 {
				fibermw.NoEffect(c) // e.g. the provider refused before charging
				return c.Status(fiber.StatusServiceUnavailable).JSON(fiber.Map{"error": "try again"})
			}
			if n == 2 {
				return c.SendStatus(fiber.StatusTooManyRequests) // not processed: released as well
			}
			return c.Status(fiber.StatusCreated).JSON(fiber.Map{"run": n})
		})
		ctx := testCtx(t)
		key := uuid.NewString()
		require.Equal(t, 503, send(t, ctx, "POST", url, `{}`, "Idempotency-Key", key).Status)
		require.Equal(t, 429, send(t, ctx, "POST", url, `{}`, "Idempotency-Key", key).Status)
		a := send(t, ctx, "POST", url, `{}`, "Idempotency-Key", key)
		require.Equal(t, 201, a.Status)
		require.False(t, a.replayed())
		b := send(t, ctx, "POST", url, `{}`, "Idempotency-Key", key)
		require.True(t, b.replayed())
		require.Equal(t, a.Body, b.Body)
		require.EqualValues(t, 3, runs.Load())

		kv, err := idem.GetKey(ctx, "POST /op|"+key)
		require.NoError(t, err)
		require.EqualValues(t, 3, kv.Operation.FencingToken, "three admissions")
	})
}

func TestPanicIsUncertain(t *testing.T) {
	srv := servertest.Start(t, dbs.SQLite)
	idem := newClient(t, srv)
	var runs atomic.Int64
	url := statusService(t, fibermw.Config{Client: idem}, &runs, func(c *fiber.Ctx, n int64) error {
		panic("effect half done")
	})
	ctx := testCtx(t)
	key := uuid.NewString()
	a := send(t, ctx, "POST", url, `{}`, "Idempotency-Key", key)
	require.Equal(t, 500, a.Status, "recover answers the re-raised panic")
	kv, err := idem.GetKey(ctx, "POST /op|"+key)
	require.NoError(t, err)
	require.Equal(t, client.StateUncertain, kv.Operation.State)
	require.Contains(t, kv.Operation.Outcome.Note, "effect half done")
	b := send(t, ctx, "POST", url, `{}`, "Idempotency-Key", key)
	require.Equal(t, 409, b.Status)
	require.EqualValues(t, 1, runs.Load())
}

func TestCancelledRequestStillRecordsTheOutcome(t *testing.T) {
	eachDB(t, func(t *testing.T, srv *servertest.Server) {
		idem := newClient(t, srv)
		entered, proceed := make(chan struct{}), make(chan struct{})
		reqCtx, cancelReq := context.WithCancel(context.Background())
		app := newApp()
		// The service cancels a request's context when its client goes away (the test
		// cancels both at once); the outcome must be written anyway.
		app.Use(func(c *fiber.Ctx) error {
			if c.Get("X-Test-Cancellable") != "" {
				c.SetUserContext(reqCtx)
			}
			return c.Next()
		})
		var runs atomic.Int64
		app.Post("/op", fibermw.New(fibermw.Config{Client: idem}), func(c *fiber.Ctx) error {
			runs.Add(1)
			close(entered)
			<-proceed
			return c.Status(fiber.StatusCreated).JSON(fiber.Map{"done": true})
		})
		url := serve(t, app) + "/op"
		key := uuid.NewString()
		clientCtx, cancelClient := context.WithCancel(context.Background())
		errc := make(chan error, 1)
		go func() {
			_, err := trySend(clientCtx, "POST", url, `{}`, "Idempotency-Key", key, "X-Test-Cancellable", "1")
			errc <- err
		}()
		<-entered
		cancelClient()
		cancelReq()
		require.ErrorIs(t, <-errc, context.Canceled)
		close(proceed)

		// The handler finishes after its client left; wait (bounded by the test context) for
		// the middleware to record the outcome.
		ctx := testCtx(t)
		for {
			kv, err := idem.GetKey(ctx, "POST /op|"+key)
			require.NoError(t, err)
			if kv.Operation.State != client.StateInProgress {
				require.Equal(t, client.StateSucceeded, kv.Operation.State)
				break
			}
			select {
			case <-ctx.Done():
				t.Fatal("the outcome was never recorded")
			case <-time.After(10 * time.Millisecond):
			}
		}
		a := send(t, ctx, "POST", url, `{}`, "Idempotency-Key", key)
		require.Equal(t, 201, a.Status)
		require.True(t, a.replayed())
		require.JSONEq(t, `{"done":true}`, a.Body)
		require.EqualValues(t, 1, runs.Load())
	})
}

func TestIdemgateUnavailable(t *testing.T) {
	proxy := servertest.NewProxy(t)
	srv := servertest.Start(t, servertest.OpenThrough(t, dbs.PostgresURL, proxy))
	idem := newClient(t, srv, client.WithRetry(client.RetryPolicy{MaxAttempts: 1}))
	proxy.SetDown(true)
	ctx := testCtx(t)

	var runs atomic.Int64
	closed := statusService(t, fibermw.Config{Client: idem}, &runs, func(c *fiber.Ctx, _ int64) error {
		return c.SendStatus(fiber.StatusCreated)
	})
	a := send(t, ctx, "POST", closed, `{}`, "Idempotency-Key", uuid.NewString())
	require.Equal(t, 503, a.Status)
	require.Equal(t, fibermw.CodeUnavailable, a.Problem.Code)
	require.NotEmpty(t, a.Header.Get("Retry-After"))
	require.Zero(t, runs.Load(), "fail closed: never run unguarded")

	open := statusService(t, fibermw.Config{Client: idem, FailOpen: true}, &runs, func(c *fiber.Ctx, _ int64) error {
		_, guarded := fibermw.FromContext(c)
		require.False(t, guarded)
		return c.SendStatus(fiber.StatusCreated)
	})
	require.Equal(t, 201, send(t, ctx, "POST", open, `{}`, "Idempotency-Key", uuid.NewString()).Status)
	require.EqualValues(t, 1, runs.Load())
}

func TestStoredResponses(t *testing.T) {
	eachDB(t, func(t *testing.T, srv *servertest.Server) {
		idem := newClient(t, srv)
		var runs atomic.Int64
		url := statusService(t, fibermw.Config{Client: idem}, &runs, func(c *fiber.Ctx, _ int64) error {
			switch c.Query("kind") {
			case "binary":
				c.Set(fiber.HeaderContentType, "application/octet-stream")
				return c.Status(fiber.StatusOK).Send([]byte{0, 1, 2, 0xff, '\n'})
			case "pretty":
				c.Set(fiber.HeaderContentType, "application/json")
				return c.Status(fiber.StatusOK).SendString("{\n  \"b\": 1,\n  \"a\": \"<x>\"\n}\n")
			case "invalid":
				return c.Status(fiber.StatusUnprocessableEntity).JSON(fiber.Map{"error": "amount must be positive"})
			case "empty":
				return c.SendStatus(fiber.StatusNoContent)
			case "huge":
				return c.Status(fiber.StatusCreated).SendString(strings.Repeat("x", client.MaxResponseBytes))
			}
			return c.JSON(fiber.Map{"html": "<b>&</b>", "unicode": "ü\u2028"})
		})
		ctx := testCtx(t)
		for _, kind := range []string{"json", "binary", "pretty", "invalid", "empty"} {
			key := uuid.NewString()
			u := url + "?kind=" + kind
			a := send(t, ctx, "POST", u, `{}`, "Idempotency-Key", key)
			b := send(t, ctx, "POST", u, `{}`, "Idempotency-Key", key)
			require.True(t, b.replayed(), kind)
			require.Equal(t, a.Status, b.Status, kind)
			require.Equal(t, a.Body, b.Body, "%s: byte for byte", kind)
			require.Equal(t, a.Header.Get("Content-Type"), b.Header.Get("Content-Type"), kind)
		}

		// A JSON body is stored as JSON, readable for operators.
		key := uuid.NewString()
		send(t, ctx, "POST", url+"?kind=json", `{}`, "Idempotency-Key", key)
		kv, err := idem.GetKey(ctx, "POST /op|"+key)
		require.NoError(t, err)
		require.Contains(t, string(kv.Operation.Outcome.Response), `"body":{"html"`)

		// Over 64 KiB: recorded without the body; retries are told, not given another body.
		key = uuid.NewString()
		a := send(t, ctx, "POST", url+"?kind=huge", `{}`, "Idempotency-Key", key)
		require.Equal(t, 201, a.Status)
		b := send(t, ctx, "POST", url+"?kind=huge", `{}`, "Idempotency-Key", key)
		require.Equal(t, 409, b.Status)
		require.Equal(t, fibermw.CodeResponseUnavailable, b.Problem.Code)
		require.Equal(t, 201, b.Problem.OriginalStatus)
		kv, err = idem.GetKey(ctx, "POST /op|"+key)
		require.NoError(t, err)
		require.Equal(t, client.StateSucceeded, kv.Operation.State)
	})
}

func TestPassThrough(t *testing.T) {
	srv := servertest.Start(t, dbs.SQLite)
	idem := newClient(t, srv)
	var runs atomic.Int64
	app := newApp()
	mw := fibermw.New(fibermw.Config{Client: idem, Required: func(c *fiber.Ctx) bool { return c.Query("strict") != "" }})
	handler := func(c *fiber.Ctx) error {
		_, guarded := fibermw.FromContext(c)
		return c.SendString(fmt.Sprint(runs.Add(1), guarded))
	}
	app.Get("/op", mw, handler)
	app.Post("/op", mw, handler)
	url := serve(t, app) + "/op"
	ctx := testCtx(t)
	require.Equal(t, "1 false", send(t, ctx, "GET", url, "", "Idempotency-Key", "k").Body, "GET is not guarded")
	require.Equal(t, "2 false", send(t, ctx, "POST", url, `{}`).Body, "an optional key may be left out")
	require.Equal(t, 400, send(t, ctx, "POST", url+"?strict=1", `{}`).Status)
	require.Equal(t, "3 true", send(t, ctx, "POST", url, `{}`, "Idempotency-Key", "k").Body)
}

func TestScopes(t *testing.T) {
	srv := servertest.Start(t, dbs.Postgres)
	idem := newClient(t, srv)
	app := newApp()
	var runs atomic.Int64
	h := func(c *fiber.Ctx) error { return c.SendString(strconv.FormatInt(runs.Add(1), 10)) }
	app.Post("/a", fibermw.New(fibermw.Config{Client: idem}), h)
	app.Post("/b", fibermw.New(fibermw.Config{Client: idem}), h)
	user := fibermw.New(fibermw.Config{Client: idem, KeyPrefix: "svc ",
		Scope: func(c *fiber.Ctx) string { return "user:" + c.Get("X-User") }})
	app.Post("/u", user, h)
	base := serve(t, app)
	ctx := testCtx(t)
	key := uuid.NewString()
	require.Equal(t, "1", send(t, ctx, "POST", base+"/a", `{}`, "Idempotency-Key", key).Body)
	require.Equal(t, "2", send(t, ctx, "POST", base+"/b", `{}`, "Idempotency-Key", key).Body, "another route, another key")
	require.Equal(t, "1", send(t, ctx, "POST", base+"/a", `{}`, "Idempotency-Key", key).Body)
	require.Equal(t, "3", send(t, ctx, "POST", base+"/u", `{}`, "Idempotency-Key", key, "X-User", "ann").Body)
	require.Equal(t, "4", send(t, ctx, "POST", base+"/u", `{}`, "Idempotency-Key", key, "X-User", "bob").Body)
	_, err := idem.GetKey(ctx, "svc user:bob|"+key)
	require.NoError(t, err)

	// Another idemgate tenant is another namespace too.
	other := newClient(t, &servertest.Server{URL: srv.URL, APIKey: srv.NewAPIKey(t)})
	_, err = other.GetKey(ctx, "POST /a|"+key)
	require.True(t, errors.Is(err, client.ErrNotFound))
}

// TestFingerprintIsOfTheBodyAsSent: the fingerprint hashes the request body as it arrived,
// never decoded by Content-Encoding. Fiber's c.Body() decodes it: with an encoding it does not
// know every body read as empty, and two different bodies under one key were answered with
// the first one's response instead of 422; with gzip it decompressed whatever it was sent (a
// 509 KB body became 512 MiB in memory).
func TestFingerprintIsOfTheBodyAsSent(t *testing.T) {
	srv := servertest.Start(t, dbs.Postgres)
	app := newApp()
	app.Post("/upload", fibermw.New(fibermw.Config{Client: newClient(t, srv)}), func(c *fiber.Ctx) error {
		return c.SendStatus(fiber.StatusCreated)
	})
	base := serve(t, app)
	ctx := testCtx(t)
	first := send(t, ctx, "POST", base+"/upload", "abcd", "Idempotency-Key", "enc-1", "Content-Encoding", "aa, bb")
	require.Equal(t, 201, first.Status)
	other := send(t, ctx, "POST", base+"/upload", "abcdefgh", "Idempotency-Key", "enc-1", "Content-Encoding", "aa, bb")
	require.Equal(t, 422, other.Status, "another body under the same key")
	same := send(t, ctx, "POST", base+"/upload", "abcd", "Idempotency-Key", "enc-1", "Content-Encoding", "aa, bb")
	require.True(t, same.replayed())
}

// TestOutcomeWaitsOutShortOutage: idemgate is unreachable for 1.5 s just as the handler ends.
// The outcome is recorded once it is back (within WriteTimeout), so a retry gets the response
// replayed. Before, the client's own retries gave up after about half a second and the key
// stayed in progress until its TTL (24 h by default): every retry answered 409.
func TestOutcomeWaitsOutShortOutage(t *testing.T) {
	srv := servertest.Start(t, dbs.Postgres)
	px := testkit.NewProxy(t, strings.TrimPrefix(srv.URL, "http://"))
	idem, err := client.New("http://"+px.Addr(), srv.APIKey, client.WithHTTPClient(servertest.OwnTransport(t)))
	require.NoError(t, err)
	app := newApp()
	app.Post("/charge", fibermw.New(fibermw.Config{Client: idem}), func(c *fiber.Ctx) error {
		px.SetDown(true) // idemgate goes away while the effect happens
		time.AfterFunc(1500*time.Millisecond, func() { px.SetDown(false) })
		return c.Status(fiber.StatusCreated).JSON(fiber.Map{"charge": uuid.NewString()})
	})
	base := serve(t, app)
	ctx := testCtx(t)
	first := send(t, ctx, "POST", base+"/charge", chargeBody, "Idempotency-Key", "outage-1")
	require.Equal(t, 201, first.Status)
	again := send(t, ctx, "POST", base+"/charge", chargeBody, "Idempotency-Key", "outage-1")
	require.Equal(t, 201, again.Status, "%s", again.Body)
	require.True(t, again.replayed())
	require.Equal(t, first.Body, again.Body)
}

// TestReconciledLostAnswerIsNotReplayed: a handler answers 500 (recorded uncertain, with that
// 500 stored); an operator then confirms the effect happened (reconciled succeeded). A retry
// gets 409 response_unavailable saying so. Before, it got the stored 500 replayed with
// Idempotent-Replayed: true, which still said the outcome was unknown.
func TestReconciledLostAnswerIsNotReplayed(t *testing.T) {
	srv := servertest.Start(t, dbs.Postgres)
	app := newApp()
	app.Post("/charge", fibermw.New(fibermw.Config{Client: newClient(t, srv)}), func(c *fiber.Ctx) error {
		return c.Status(fiber.StatusInternalServerError).JSON(fiber.Map{"error": "the provider timed out"})
	})
	base := serve(t, app)
	ctx := testCtx(t)
	first := send(t, ctx, "POST", base+"/charge", chargeBody, "Idempotency-Key", "recon-1")
	require.Equal(t, 500, first.Status)

	auth := "Bearer " + srv.APIKey
	queue := send(t, ctx, "GET", srv.URL+"/v1/operations?state=uncertain", "", "Authorization", auth)
	var list struct {
		Items []struct{ ID string } `json:"items"`
	}
	require.NoError(t, json.Unmarshal([]byte(queue.Body), &list))
	require.Len(t, list.Items, 1)
	id := list.Items[0].ID
	job := send(t, ctx, "POST", srv.URL+"/v1/reconciliations", `{"job_id":"recon-job-1","status":"succeeded",
		"note":"charged at the provider: ch_1","operation_ids":["`+id+`"]}`, "Authorization", auth)
	require.Less(t, job.Status, 300, "%s", job.Body)
	require.Eventually(t, func() bool {
		op := send(t, ctx, "GET", srv.URL+"/v1/operations/"+id, "", "Authorization", auth)
		return strings.Contains(op.Body, `"state":"succeeded"`)
	}, 10*time.Second, 20*time.Millisecond)

	again := send(t, ctx, "POST", base+"/charge", chargeBody, "Idempotency-Key", "recon-1")
	require.Equal(t, 409, again.Status, "%s", again.Body)
	require.Equal(t, fibermw.CodeResponseUnavailable, again.Problem.Code)
	require.False(t, again.replayed())
}
