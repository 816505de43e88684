package fibermw

import (
	"math"
	"net/http"
	"strconv"
	"time"

	"github.com/gofiber/fiber/v2"
	"github.com/idemgate/idemgate/web/client"
)

// Problem codes of the middleware's own answers (the `code` member of its problem+json).
const (
	// CodeKeyMissing (400): a guarded request without Idempotency-Key where one is required.
	CodeKeyMissing = "idempotency_key_missing"
	// CodeKeyInvalid (400): Idempotency-Key is malformed or appears more than once.
	CodeKeyInvalid = "idempotency_key_invalid"
	// CodeInProgress (409, with Retry-After): the original request with this key is still
	// running.
	CodeInProgress = "request_in_progress"
	// CodeFingerprintMismatch (422): the key was used for a different request (method, path,
	// query, body or fingerprinted headers).
	CodeFingerprintMismatch = client.CodeFingerprintMismatch
	// CodeOutcomeUncertain (409): the original request ended without a known outcome (a 5xx
	// or a panic); an operator must reconcile it, or the key's TTL end, before it can run
	// again.
	CodeOutcomeUncertain = client.CodeOutcomeUncertain
	// CodeResponseUnavailable (409): the original request completed but its response cannot
	// be replayed (it was over 64 KiB, or an operator recorded the outcome).
	CodeResponseUnavailable = "response_unavailable"
	// CodeUnavailable (503, with Retry-After): idemgate could not be asked, so the request was
	// not run (fail closed).
	CodeUnavailable = "idempotency_unavailable"
)

// Problem is an answer of the middleware itself, written as RFC 9457 application/problem+json
// by default (Config.Respond to change that).
type Problem struct {
	Type   string              `json:"type"`
	Title  string              `json:"title"`
	Status int                 `json:"status"`
	Detail string              `json:"detail,omitempty"`
	Code   string              `json:"code"`
	Errors []client.FieldError `json:"errors,omitempty"`
	// OriginalStatus is the status of the original response, for CodeResponseUnavailable.
	OriginalStatus int `json:"original_status,omitempty"`
	// RetryAfter, when positive, is sent as the Retry-After header, in whole seconds
	// (rounded up).
	RetryAfter time.Duration `json:"-"`
}

func newProblem(status int, code, detail string) *Problem {
	return &Problem{Type: "about:blank", Title: http.StatusText(status), Status: status, Code: code, Detail: detail}
}

// WriteProblem is the default Config.Respond: it sets Retry-After and writes p as
// application/problem+json with p.Status.
func WriteProblem(c *fiber.Ctx, p *Problem) error {
	if p.RetryAfter > 0 {
		c.Set(fiber.HeaderRetryAfter, strconv.Itoa(retryAfterSeconds(p.RetryAfter)))
	}
	return c.Status(p.Status).JSON(p, "application/problem+json")
}

func retryAfterSeconds(d time.Duration) int {
	return max(1, int(math.Ceil(d.Seconds())))
}
