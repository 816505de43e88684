package client

import (
	"encoding/json"
	"errors"
	"fmt"
	"mime"
	"net/http"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// Stable problem codes of idemgate's JSON API (docs/reference.md §4; the server's list is
// services/errors.go, its HTTP statuses web/errors.go). A Problem carries one in Code; the
// Err… sentinels below match them with errors.Is.
const (
	CodeInvalidRequest      = "invalid_request"      // 400 (also 405, 431): a field is missing, of the wrong type or over its limit
	CodeUnauthorized        = "unauthorized"         // 401: missing, unknown or revoked API key
	CodeNotOwner            = "not_owner"            // 409 on release, 403 on outcome: the owner token does not own the hold / operation
	CodeFingerprintMismatch = "fingerprint_mismatch" // 422: the key is held with another fingerprint or operation name
	CodeEffectConfirmed     = "effect_confirmed"     // 409: release of a succeeded operation
	CodeOutcomeUncertain    = "outcome_uncertain"    // 409: release of an uncertain operation (reconcile first), or acquire of a key whose operation is uncertain (Problem.Operation set)
	CodeInvalidTransition   = "invalid_transition"   // 409: a state change docs/reference.md §3 does not allow
	CodeKeyNotHeld          = "key_not_held"         // 404: release of a key with no live hold
	CodeNotFound            = "not_found"            // 404: no such key or operation in this tenant
	CodePayloadTooLarge     = "payload_too_large"    // 413: body over 256 KiB (2 MiB for AcquireBatch), or outcome response over 64 KiB
	CodeStoreUnavailable    = "store_unavailable"    // 503: idemgate's database is unreachable; retried
	CodeRateLimited         = "rate_limited"         // 429: too many failed authentications from this address; retried
	CodeInternal            = "internal"             // 500: a server bug; not retried
	CodeLeaseExpired        = "lease_expired"        // 409: renew after the lease lapsed; the operation is uncertain (docs/reference.md §8)
	CodeTooManyWaiters      = "too_many_waiters"     // 503: the instance has its maximum of waiting requests; retried
)

// Sentinel errors, one per stable problem code. errors.Is(err, ErrNotOwner) is true when err
// is (or wraps) a *Problem with Code "not_owner", whatever its message or status. Problems
// the client raises itself before sending anything (an unusable argument) have Status 0 and
// match ErrInvalidRequest.
var (
	ErrInvalidRequest      = &Problem{Code: CodeInvalidRequest, Title: "Invalid request"}
	ErrUnauthorized        = &Problem{Code: CodeUnauthorized, Title: "Unauthorized"}
	ErrNotOwner            = &Problem{Code: CodeNotOwner, Title: "Not the owner"}
	ErrFingerprintMismatch = &Problem{Code: CodeFingerprintMismatch, Title: "Fingerprint mismatch"}
	ErrEffectConfirmed     = &Problem{Code: CodeEffectConfirmed, Title: "Effect confirmed"}
	ErrOutcomeUncertain    = &Problem{Code: CodeOutcomeUncertain, Title: "Outcome uncertain"}
	ErrInvalidTransition   = &Problem{Code: CodeInvalidTransition, Title: "Invalid transition"}
	ErrKeyNotHeld          = &Problem{Code: CodeKeyNotHeld, Title: "Key not held"}
	ErrNotFound            = &Problem{Code: CodeNotFound, Title: "Not found"}
	ErrPayloadTooLarge     = &Problem{Code: CodePayloadTooLarge, Title: "Payload too large"}
	ErrStoreUnavailable    = &Problem{Code: CodeStoreUnavailable, Title: "Store unavailable"}
	ErrRateLimited         = &Problem{Code: CodeRateLimited, Title: "Rate limited"}
	ErrInternal            = &Problem{Code: CodeInternal, Title: "Internal error"}
	ErrLeaseExpired        = &Problem{Code: CodeLeaseExpired, Title: "Lease expired"}
	ErrTooManyWaiters      = &Problem{Code: CodeTooManyWaiters, Title: "Too many waiters"}
)

// ErrLeaseLost is the cause (context.Cause) of the context Do and Heartbeat cancel when the
// attempt's lease can no longer be kept: the server refused a renew (ErrLeaseExpired,
// ErrNotOwner, ErrInvalidTransition, ErrNotFound, wrapped with it), or no renew succeeded
// before the lease's local deadline. The operation then is, or is about to become,
// uncertain (docs/reference.md §8): stop touching the destination.
var ErrLeaseLost = errors.New("idemgate: lease lost")

// ErrUnexpectedAnswer is wrapped by the error of a call whose 2xx answer does not have the
// shape the API promises for it, e.g. an acquire answered 201 with a state other than
// in_progress. It is not a *Problem: no problem code was sent. The call's effect on the server
// is unknown, so treat it as not admitted and reconcile by reading the key or operation.
var ErrUnexpectedAnswer = errors.New("unexpected answer")

// FieldError names one invalid request field (the problem's `errors` member).
type FieldError struct {
	Field   string `json:"field"`
	Message string `json:"message"`
}

// Problem is an error answer of idemgate: an RFC 9457 problem details object
// (application/problem+json) with idemgate's extension members `code`, `errors` and
// `request_id`, plus what the client saw around it. A non-2xx answer that is not a problem
// document (a proxy's HTML 502, say) still becomes a Problem, with an empty Code.
//
// Match it with errors.Is against the Err… sentinels, or take it apart with errors.As:
//
//	var p *client.Problem
//	if errors.As(err, &p) { log.Print(p.Status, p.Code, p.RequestID) }
type Problem struct {
	// Type is the problem type URI; idemgate sends "about:blank".
	Type string `json:"type,omitempty"`
	// Title is a short summary, the HTTP reason phrase for idemgate's problems.
	Title string `json:"title,omitempty"`
	// Status is the HTTP status code of the answer (the status line wins over the body's
	// `status` member, RFC 9457 §3.1.2). It is 0 for a problem the client raised before
	// sending anything.
	Status int `json:"status,omitempty"`
	// Detail is a human-readable explanation, safe to log.
	Detail string `json:"detail,omitempty"`
	// Instance is the problem's instance URI, if the server sent one.
	Instance string `json:"instance,omitempty"`
	// Code is idemgate's stable, machine-readable code (the Code… constants); empty when the
	// answer did not come from idemgate.
	Code string `json:"code,omitempty"`
	// Errors lists invalid fields for invalid_request.
	Errors []FieldError `json:"errors,omitempty"`
	// Operation is the key's operation when an acquire is refused with outcome_uncertain
	// (docs/reference.md §8): its state, reason and fencing token, to reconcile it. nil
	// otherwise.
	Operation *Operation `json:"operation,omitempty"`
	// RequestID is the server's X-Request-ID for the failed request (to find it in its log).
	RequestID string `json:"request_id,omitempty"`
	// RetryAfter is the answer's Retry-After header as a duration (RFC 9110 §10.2.3, whole
	// seconds or an HTTP date); 0 when absent. idemgate sends it with 503 and 429.
	RetryAfter time.Duration `json:"-"`
	// Attempts is how many tries the client made before giving up with this problem (1 when
	// it was not retried). When it is more than 1, an earlier try whose answer was lost may
	// have taken effect: see Client.Release.
	Attempts int `json:"-"`
}

// Error returns "idemgate: <status> <code>: <detail> (request <id>)".
func (p *Problem) Error() string {
	var b strings.Builder
	b.WriteString("idemgate: ")
	if p.Status != 0 {
		b.WriteString(strconv.Itoa(p.Status))
		b.WriteByte(' ')
	}
	switch {
	case p.Code != "":
		b.WriteString(p.Code)
	case p.Title != "":
		b.WriteString(p.Title)
	default:
		b.WriteString("error")
	}
	if p.Detail != "" {
		b.WriteString(": ")
		b.WriteString(p.Detail)
	}
	for i, f := range p.Errors {
		if i == 0 {
			b.WriteString(" [")
		} else {
			b.WriteString("; ")
		}
		b.WriteString(f.Field + " " + f.Message)
		if i == len(p.Errors)-1 {
			b.WriteByte(']')
		}
	}
	if p.RequestID != "" {
		b.WriteString(" (request " + p.RequestID + ")")
	}
	return b.String()
}

// Is reports whether target is a *Problem with the same non-empty Code, so that
// errors.Is(err, ErrNotOwner) matches any not_owner answer.
func (p *Problem) Is(target error) bool {
	t, ok := target.(*Problem)
	return ok && t.Code != "" && t.Code == p.Code
}

// Temporary reports whether the problem is one the client retries: 429, 502, 503 and 504.
// Every other answer is a decision of the server, and asking again gets the same one.
func (p *Problem) Temporary() bool {
	switch p.Status {
	case http.StatusTooManyRequests, http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout:
		return true
	}
	return false
}

// invalidArgument is a problem the client raises itself, before sending anything.
func invalidArgument(field, msg string) *Problem {
	return &Problem{Type: "about:blank", Title: "Invalid argument", Code: CodeInvalidRequest,
		Detail: "The request was not sent: an argument is invalid.", Errors: []FieldError{{Field: field, Message: msg}}}
}

// maxDetailBytes bounds the part of a non-problem body kept as Detail.
const maxDetailBytes = 256

// decodeProblem turns a non-2xx answer into a *Problem. It never fails: a body that is not a
// problem document leaves Code empty and keeps at most 256 bytes of a text body as Detail.
// now is the time Retry-After dates are measured from.
func decodeProblem(status int, h http.Header, body []byte, now time.Time) *Problem {
	p := &Problem{Status: status}
	mt, _, _ := mime.ParseMediaType(h.Get("Content-Type"))
	var doc Problem
	isJSON := mt == "application/problem+json" || mt == "application/json" || strings.HasSuffix(mt, "+json")
	if isJSON && json.Unmarshal(body, &doc) == nil {
		p.Type, p.Title, p.Detail, p.Instance = doc.Type, doc.Title, doc.Detail, doc.Instance
		p.Code, p.Errors, p.RequestID = doc.Code, doc.Errors, doc.RequestID
		if doc.Operation != nil && doc.Operation.ID != "" {
			doc.Operation.normalize()
			p.Operation = doc.Operation
		}
	} else if len(body) > 0 && (mt == "" || strings.HasPrefix(mt, "text/")) {
		p.Detail = textSnippet(body)
	}
	if p.Type == "" {
		p.Type = "about:blank"
	}
	if p.Title == "" {
		p.Title = http.StatusText(status)
	}
	if p.RequestID == "" {
		p.RequestID = h.Get("X-Request-ID")
	}
	p.RetryAfter = parseRetryAfter(h.Get("Retry-After"), now)
	return p
}

// textSnippet returns the start of a text body, cut at a character boundary, with control
// characters replaced, for a log-safe Detail.
func textSnippet(body []byte) string {
	if len(body) > maxDetailBytes {
		body = body[:maxDetailBytes]
		for len(body) > 0 && !utf8.Valid(body) {
			body = body[:len(body)-1]
		}
	}
	s := strings.TrimSpace(strings.ToValidUTF8(string(body), "\uFFFD"))
	return strings.Map(func(r rune) rune {
		if r < 0x20 || r == 0x7f {
			return ' '
		}
		return r
	}, s)
}

// maxRetryAfter bounds a parsed Retry-After, so a hostile or broken header cannot overflow a
// time.Duration; the caller's context bounds the actual wait anyway.
const maxRetryAfter = 24 * time.Hour

// parseRetryAfter reads a Retry-After value (RFC 9110 §10.2.3): delay-seconds (a non-negative
// integer) or an HTTP-date, measured from now. It returns 0 for an absent, malformed or past
// value and at most 24 hours.
func parseRetryAfter(v string, now time.Time) time.Duration {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0
	}
	if v[0] >= '0' && v[0] <= '9' {
		for i := 0; i < len(v); i++ {
			if v[i] < '0' || v[i] > '9' {
				return 0
			}
		}
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n > int64(maxRetryAfter/time.Second) {
			return maxRetryAfter
		}
		return time.Duration(n) * time.Second
	}
	t, err := http.ParseTime(v)
	if err != nil {
		return 0
	}
	d := t.Sub(now)
	if d <= 0 {
		return 0
	}
	return min(d, maxRetryAfter)
}

// wrapf prefixes err with the call it came from, keeping it matchable with errors.Is/As.
func wrapf(method, path string, err error) error {
	return fmt.Errorf("idemgate: %s %s: %w", method, path, err)
}
