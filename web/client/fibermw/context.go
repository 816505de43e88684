package fibermw

import (
	"time"

	"github.com/gofiber/fiber/v2"
	"github.com/idemgate/idemgate/web/client"
)

type infoKey struct{}

// Info is what the middleware knows about an admitted request, for its handler: get it with
// FromContext.
type Info struct {
	// Key is the Idempotency-Key as the client sent it (unquoted).
	Key string
	// ServerKey is the scoped key held at idemgate ("<scope>|<key>").
	ServerKey string
	// OperationID is idemgate's operation of this attempt.
	OperationID string
	// FencingToken is 1 for the key's first admission and one more for each later one: pass
	// it to a destination that can reject stale attempts.
	FencingToken int64
	// ExpiresAt is when the hold ends; a retry after it is admitted again.
	ExpiresAt time.Time
	// LeaseExpiresAt is when the attempt's lease lapsed at admission (docs/reference.md §8);
	// with Config.Lease the middleware renews it while the handler runs.
	LeaseExpiresAt time.Time
	// PreviousOperation is set when an earlier generation of the key may have had its effect:
	// uncertain (say, the handler failed with a 5xx or panicked), or succeeded and admitted
	// again after the TTL; the newest such, skipping released ones (docs/reference.md §4). A handler whose effect must not happen twice should check the
	// destination (e.g. by PreviousOperation.Outcome.Receipt) before acting.
	PreviousOperation *client.PreviousOperation

	ownerToken string
	noEffect   bool
	receipt    string
}

// FromContext returns the Info of a request the middleware admitted; ok is false when the
// request was not guarded (no key on an optional route, a skipped method, FailOpen).
func FromContext(c *fiber.Ctx) (info *Info, ok bool) {
	info, ok = c.Locals(infoKey{}).(*Info)
	return info, ok && info != nil
}

// NoEffect declares that the handler's request had no effect that must stay done — it was
// refused before anything happened, or everything was rolled back — whatever status the
// response has. The middleware then records the outcome failed with release (docs/reference.md §3
// in_progress → failed → released), so a retry with the same key runs the handler again.
// Without it a 5xx response is recorded uncertain and the key stays blocked until an
// operator reconciles it or the TTL ends. It does nothing on an unguarded request.
func NoEffect(c *fiber.Ctx) {
	if info, ok := FromContext(c); ok {
		info.noEffect = true
	}
}

// SetReceipt sets the receipt recorded with the outcome (≤ 512 characters): the
// destination's reference of the effect (a charge id, a message id), shown to operators and
// to later attempts in PreviousOperation. It does nothing on an unguarded request.
func SetReceipt(c *fiber.Ctx, receipt string) {
	if info, ok := FromContext(c); ok {
		info.receipt = receipt
	}
}
