package services

import (
	"context"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"net"
	"syscall"

	"github.com/jackc/pgx/v5/pgconn"
)

// Stable problem codes (docs/reference.md §4, issue 2). web/ maps each to one HTTP status.
const (
	CodeInvalidRequest      = "invalid_request"
	CodeUnauthorized        = "unauthorized"
	CodeFingerprintMismatch = "fingerprint_mismatch"
	CodeNotOwner            = "not_owner"
	CodeEffectConfirmed     = "effect_confirmed"
	CodeOutcomeUncertain    = "outcome_uncertain"
	CodeKeyNotHeld          = "key_not_held"
	CodeInvalidTransition   = "invalid_transition"
	CodeNotFound            = "not_found"
	CodePayloadTooLarge     = "payload_too_large"
	CodeStoreUnavailable    = "store_unavailable"
	CodeRateLimited         = "rate_limited"
	CodeLeaseExpired        = "lease_expired"
	CodeTooManyWaiters      = "too_many_waiters"
	CodeInternal            = "internal"
	// CodeJobIDReused refuses a bulk reconciliation whose job_id names an earlier job with
	// another outcome, note or selection (docs/reference.md §10).
	CodeJobIDReused = "job_id_reused"
)

// FieldError names one invalid request field and says what is wrong with it, for the
// problem+json `errors` array.
type FieldError struct {
	Field   string
	Message string
}

// Error is a domain error with a stable Code. Message is safe to show to the caller. Fields is
// set for validation errors. errors.Is matches two *Error values by Code, so callers can test
// `errors.Is(err, ErrNotOwner)` whatever the message.
type Error struct {
	Code    string
	Message string
	Fields  []FieldError
	// Operation is set on ErrOutcomeUncertain from an acquire: the key's uncertain operation,
	// which the problem document carries so the caller can reconcile without another read.
	Operation *Operation
	err       error // the cause, never shown to callers
}

// Error returns "code: message" and, for logs only, the cause.
func (e *Error) Error() string {
	if e.err != nil {
		return fmt.Sprintf("%s: %s: %v", e.Code, e.Message, e.err)
	}
	return e.Code + ": " + e.Message
}

// Is reports whether target is an *Error with the same Code.
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	return ok && t.Code == e.Code
}

// Unwrap returns the cause, if any.
func (e *Error) Unwrap() error { return e.err }

// Sentinels for errors.Is. Functions return fresh *Error values with specific messages.
var (
	ErrInvalidRequest      = &Error{Code: CodeInvalidRequest, Message: "The request is invalid."}
	ErrUnauthorized        = &Error{Code: CodeUnauthorized, Message: "A valid API key is required."}
	ErrFingerprintMismatch = &Error{Code: CodeFingerprintMismatch, Message: "The key is held, or protected by its last operation's horizon, for a request with a different fingerprint or operation name."}
	ErrNotOwner            = &Error{Code: CodeNotOwner, Message: "The owner token does not own this operation's hold."}
	ErrEffectConfirmed     = &Error{Code: CodeEffectConfirmed, Message: "The operation succeeded; its key cannot be released."}
	ErrOutcomeUncertain    = &Error{Code: CodeOutcomeUncertain, Message: "The operation's outcome is uncertain; reconcile it before releasing."}
	ErrKeyNotHeld          = &Error{Code: CodeKeyNotHeld, Message: "The key has no live hold."}
	ErrInvalidTransition   = &Error{Code: CodeInvalidTransition, Message: "The operation cannot move to that state."}
	ErrNotFound            = &Error{Code: CodeNotFound, Message: "Not found."}
	ErrPayloadTooLarge     = &Error{Code: CodePayloadTooLarge, Message: "The payload is too large."}
	ErrStoreUnavailable    = &Error{Code: CodeStoreUnavailable, Message: "The database is unavailable; retry later."}
	ErrLeaseExpired        = &Error{Code: CodeLeaseExpired, Message: "The lease already lapsed; the operation is uncertain and renewing cannot revive it. Nothing was changed."}
	ErrTooManyWaiters      = &Error{Code: CodeTooManyWaiters, Message: "Too many requests are waiting on this instance; retry after Retry-After seconds."}
	ErrRateLimited         = &Error{Code: CodeRateLimited, Message: "Too many failed authentications from your address; retry after Retry-After seconds."}
)

func invalid(fields ...FieldError) *Error {
	return &Error{Code: CodeInvalidRequest, Message: "The request has invalid fields.", Fields: fields}
}

// storeError classifies a database error: connection-level failures become
// ErrStoreUnavailable (503 with Retry-After) so callers know a retry may succeed; anything else
// is returned wrapped with op for the log, and web/ answers it as an internal error.
func storeError(op string, err error) error {
	if err == nil {
		return nil
	}
	var de *Error
	if errors.As(err, &de) {
		return err
	}
	if IsUnavailable(err) {
		return &Error{Code: CodeStoreUnavailable, Message: ErrStoreUnavailable.Message, err: fmt.Errorf("%s: %w", op, err)}
	}
	return fmt.Errorf("%s: %w", op, err)
}

// IsUnavailable reports whether err means the database could not be reached or dropped the
// connection (as opposed to refusing a statement), so the request may be retried later.
func IsUnavailable(err error) bool {
	if err == nil {
		return false
	}
	if errors.Is(err, driver.ErrBadConn) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) ||
		errors.Is(err, context.DeadlineExceeded) {
		return true
	}
	var ne net.Error
	if errors.As(err, &ne) {
		return true
	}
	// SQLite: SQLITE_BUSY (5) or SQLITE_LOCKED (6), primary or extended code, once busy_timeout
	// (the store timeout) has passed: another writer holds the database; nothing was changed.
	var se interface{ Code() int }
	if errors.As(err, &se) {
		if c := se.Code() & 0xff; c == 5 || c == 6 {
			return true
		}
	}
	var ce *pgconn.ConnectError
	if errors.As(err, &ce) {
		return true
	}
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		// Class 08: connection exception; 57P01-57P03: admin shutdown, crash shutdown, cannot
		// connect now (server starting or stopping); 53300: too many connections.
		if len(pe.Code) == 5 && pe.Code[:2] == "08" {
			return true
		}
		// 40001/40P01: serialization failure or deadlock victim; nothing was changed and the
		// same request may succeed when retried.
		// 25006: a write reached a standby (a primary demoted in a failover, docs/operations.md
		// "High availability"); nothing was written, and models closes that connection so the
		// retry reaches the new primary.
		switch pe.Code {
		case "57P01", "57P02", "57P03", "53300", "40001", "40P01", "25006":
			return true
		}
	}
	return pgconn.SafeToRetry(err)
}
