// Package fibermw is idempotency middleware for Fiber v2 services, backed by idemgate.
//
// It implements the Idempotency-Key header of the IETF draft
// (draft-ietf-httpapi-idempotency-key-header): a client sends a unique key with a POST or
// PATCH, and however often it retries that request — after a timeout, a dropped connection,
// a crash of either side — the handler's effect happens at most once and every retry gets
// the first response back, marked Idempotent-Replayed: true.
//
// Three lines: create a client, add the middleware, and let clients send the key.
//
//	idem, err := client.New("http://127.0.0.1:8080", os.Getenv("IDEMGATE_API_KEY"))
//	app.Post("/v1/charges", fibermw.New(fibermw.Config{Client: idem}), charge)
//
// Clients send a fresh key per request and reuse it on every retry of that request:
//
//	KEY=$(cat /proc/sys/kernel/random/uuid)   # or uuidgen, or any unique string
//	curl -XPOST localhost:3000/v1/charges -H "Idempotency-Key: $KEY" \
//	  -H 'Content-Type: application/json' -d '{"amount":1200}'
//
// A complete service (psp stands for your payment provider's client):
//
//	package main
//
//	import (
//		"errors"
//		"log"
//		"os"
//
//		"github.com/gofiber/fiber/v2"
//		"github.com/gofiber/fiber/v2/middleware/recover"
//		"github.com/idemgate/idemgate/web/client"
//		"github.com/idemgate/idemgate/web/client/fibermw"
//	)
//
//	func main() {
//		idem, err := client.New(os.Getenv("IDEMGATE_URL"), os.Getenv("IDEMGATE_API_KEY"))
//		if err != nil {
//			log.Fatal(err)
//		}
//		app := fiber.New()
//		app.Use(recover.New()) // before fibermw: a panic is recorded uncertain, then answered 500
//		app.Post("/v1/charges", fibermw.New(fibermw.Config{Client: idem}), func(c *fiber.Ctx) error {
//			var in struct{ Amount int64 }
//			if err := c.BodyParser(&in); err != nil {
//				return c.Status(fiber.StatusBadRequest).JSON(fiber.Map{"error": "bad body"}) // replayed as is
//			}
//			info, _ := fibermw.FromContext(c)
//			charge, err := psp.Charge(c.UserContext(), in.Amount, info.FencingToken)
//			if errors.Is(err, psp.ErrDeclinedBeforeCharging) {
//				fibermw.NoEffect(c) // nothing happened: a retry may run again
//				return c.Status(fiber.StatusPaymentRequired).JSON(fiber.Map{"error": "declined"})
//			} else if err != nil {
//				return err // 5xx: recorded uncertain; retries get 409 until an operator reconciles
//			}
//			fibermw.SetReceipt(c, charge.ID)
//			return c.Status(fiber.StatusCreated).JSON(charge)
//		})
//		log.Fatal(app.Listen(":3000"))
//	}
//
// # What is guaranteed
//
//   - One key runs the handler at most once within Config.TTL (default 24 h), across any
//     number of service instances: admission is decided by idemgate in one transaction
//     (docs/reference.md §4), not by a lock in this process.
//   - A retry while the first request runs gets 409 request_in_progress with Retry-After —
//     or, with Config.Wait (wait-and-replay), waits for the first request's outcome and gets
//     its response; a retry after it gets the stored status, allow-listed headers
//     (Config.ReplayHeaders) and body byte for byte, with Idempotent-Replayed: true.
//   - With Config.Lease a handler may run only that long without a heartbeat: the middleware
//     renews the lease while the handler runs, and cancels c.UserContext() if a renew is
//     refused (docs/reference.md §8). A crashed service's key then turns uncertain after the
//     lease, not after the TTL; with Config.OnExpiry client.OnExpiryHoldUntilReconciled it
//     is never run again until reconciled.
//   - The same key with a different request — method, path, query, media type, body
//     (JSON compared in a canonical form: member order, white space and number spelling do
//     not matter, and every number is compared exactly, never as a float64), or Authorization — is refused with 422, never answered with another request's
//     response.
//   - Keys are scoped by method and route pattern (Config.Scope, Config.KeyPrefix) and by
//     idemgate tenant (the client's API key).
//   - A handler that answers 5xx or panics may have had its effect, so its operation is
//     recorded uncertain and never released automatically: retries get 409 outcome_uncertain
//     until an operator reconciles it on idemgate's dashboard (or the TTL ends; the next
//     admission then carries PreviousOperation). NoEffect(c) says the request changed
//     nothing, and a retry may run it again.
//   - The outcome is recorded even when the client hangs up: that write uses
//     context.WithoutCancel with Config.WriteTimeout, and the client retries it safely.
//   - If idemgate cannot be asked, the request is refused with 503 and Retry-After and the
//     handler does not run (unless Config.FailOpen).
//
// # Keys
//
// A guarded request (Config.Methods: POST and PATCH by default) without Idempotency-Key is
// refused with 400 (Config.Required decides), and so is a malformed key or two
// Idempotency-Key headers. Keys follow idemgate's rules: 1–255 bytes of UTF-8, no control
// characters, compared byte-exact; the draft's quoted form "…" is accepted too. At idemgate a
// key is held scoped by method and route pattern ("POST /v1/charges|<key>" on the dashboard)
// and by the idemgate tenant of the client's API key; if your service has users of its own,
// have Config.Scope return the user's id. A key whose scoped form would pass 255 bytes is held
// hashed ("POST /v1/charges#<sha256>").
//
// # In a handler
//
// FromContext gives the admitted request's Info: its operation id and fencing token (pass it
// to destinations that can reject stale attempts) and, when an earlier generation of the key may
// have had its effect, PreviousOperation. SetReceipt records the destination's reference with the
// outcome. NoEffect says the request changed nothing, so the key is released and a retry runs
// the handler again; 408, 425 and 429 answers count as "nothing happened" too
// (Config.NoEffectStatus).
//
// With Config.Wait (e.g. 30 * time.Second) a duplicate that arrives while the original runs
// waits for its outcome (a long poll at idemgate, nothing polled here) and gets the original
// response replayed instead of 409 request_in_progress; if the original said NoEffect, the
// duplicate runs the handler itself, and after Wait with no outcome it gets the 409. With
// Config.Lease (e.g. 10 * time.Second) the middleware renews the lease every Lease/3 while
// the handler runs; when a renew is refused, c.UserContext() is cancelled and
// context.Cause wraps client.ErrLeaseLost: stop touching the destination.
//
// # Answers of the middleware
//
// The middleware's own answers are problem+json (WriteProblem, or Config.Respond) with these
// codes: idempotency_key_missing (400), idempotency_key_invalid (400), fingerprint_mismatch
// (422), request_in_progress (409, with Retry-After), outcome_uncertain (409),
// response_unavailable (409) and idempotency_unavailable (503, with Retry-After); the Code…
// constants name them.
//
// # Compared with Fiber's idempotency middleware
//
// github.com/gofiber/fiber/v2/middleware/idempotency keeps keys in one process's memory (or
// a fiber.Storage) behind a per-process lock, so two instances can both run a key; it does
// not fingerprint the request, so a key reused for another request replays the wrong
// response; its keys are global, not per route or caller; a handler that returns an error is
// not recorded, so its retry runs again even if the effect happened; concurrent retries wait
// on the lock instead of getting 409; it keeps every response header by default
// (Set-Cookie included); it accepts only 36-character keys and lets requests without a key
// through. This package does none of that.
//
// # Limits
//
// Responses are buffered (not for streaming endpoints). A recorded response is at most
// 64 KiB of JSON (idemgate's limit): a JSON body is stored as JSON when it is compact (as
// c.JSON writes it), any other body as base64 (about 48 KiB of body fit). A larger response is
// recorded without its body, and its retries get 409 response_unavailable with the original
// status, since replaying a different body would be worse. If recording the outcome fails
// (idemgate unreachable for Config.WriteTimeout), the operation stays in progress and
// becomes uncertain when the TTL ends; the failure is logged. The same holds when the service
// dies inside the handler: retries get 409 request_in_progress until the TTL ends or an
// operator records the outcome, so choose Config.TTL with that in mind.
package fibermw
