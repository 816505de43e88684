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
//	// client side: curl -XPOST …/v1/charges -H "Idempotency-Key: $(uuidgen)" -d '{"amount":1200}'
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
