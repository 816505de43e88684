package web

import (
	"encoding/json"
	"time"

	"github.com/idemgate/idemgate/services"
)

// Request and response shapes of docs/reference.md §4. They are the wire format; services' types never
// reach JSON directly. The request types are decoded by the API and encoded only by the Explore
// page (dashboard_explore.go), which shows a request as a client sends it: absent members left
// out (omitempty), never null.

type acquireRequest struct {
	Key           *string         `json:"key,omitempty"`
	TTLSeconds    *int64          `json:"ttl_seconds,omitempty"`
	Operation     *string         `json:"operation,omitempty"`
	Fingerprint   *string         `json:"fingerprint,omitempty"`
	CorrelationID *string         `json:"correlation_id,omitempty"`
	AttemptID     *string         `json:"attempt_id,omitempty"`
	Metadata      json.RawMessage `json:"metadata,omitempty"`
	LeaseSeconds  *int64          `json:"lease_seconds,omitempty"`
	OnExpiry      *string         `json:"on_expiry,omitempty"`
}

// renewRequest is the body of POST /v1/operations/{id}/renew (docs/reference.md §8).
type renewRequest struct {
	OwnerToken   *string `json:"owner_token"`
	LeaseSeconds *int64  `json:"lease_seconds"`
	ExtendTTL    *bool   `json:"extend_ttl"`
}

// renewResponse is the 200 answer to a renew: the new lease end and protection window.
type renewResponse struct {
	OperationID    string    `json:"operation_id"`
	LeaseExpiresAt time.Time `json:"lease_expires_at"`
	ExpiresAt      time.Time `json:"expires_at"`
	FencingToken   int64     `json:"fencing_token"`
}

type releaseRequest struct {
	Key        *string `json:"key,omitempty"`
	OwnerToken *string `json:"owner_token,omitempty"`
	Reason     *string `json:"reason,omitempty"`
}

type outcomeRequest struct {
	OwnerToken *string         `json:"owner_token,omitempty"`
	Status     *string         `json:"status,omitempty"`
	Receipt    *string         `json:"receipt,omitempty"`
	Response   json.RawMessage `json:"response,omitempty"`
	Note       *string         `json:"note,omitempty"`
	Release    *bool           `json:"release,omitempty"`
}

type admittedResponse struct {
	Admitted          bool                  `json:"admitted"`
	Key               string                `json:"key"`
	OperationID       string                `json:"operation_id"`
	OwnerToken        string                `json:"owner_token"`
	FencingToken      int64                 `json:"fencing_token"`
	State             string                `json:"state"`
	ExpiresAt         time.Time             `json:"expires_at"`
	LeaseExpiresAt    time.Time             `json:"lease_expires_at"`
	OnExpiry          string                `json:"on_expiry"`
	RetentionSeconds  *int64                `json:"retention_seconds"`
	HorizonSeconds    *int64                `json:"horizon_seconds"`
	TTLSeconds        int64                 `json:"ttl_seconds"`
	LeaseSeconds      int64                 `json:"lease_seconds"`
	PreviousOperation *previousOperationDTO `json:"previous_operation,omitempty"`
}

type previousOperationDTO struct {
	ID           string      `json:"id"`
	State        string      `json:"state"`
	FencingToken int64       `json:"fencing_token"`
	Outcome      *outcomeRef `json:"outcome"`
}

// outcomeRef is the part of a previous operation's outcome a new attempt needs to check the
// destination: what was reported and the destination's receipt.
type outcomeRef struct {
	Status  string  `json:"status"`
	Receipt *string `json:"receipt"`
}

type duplicateResponse struct {
	Admitted  bool         `json:"admitted"`
	Key       string       `json:"key"`
	Operation operationDTO `json:"operation"`
}

type releaseResponse struct {
	Released  bool         `json:"released"`
	Operation operationDTO `json:"operation"`
}

type operationDTO struct {
	ID                string          `json:"id"`
	Key               string          `json:"key"`
	Operation         *string         `json:"operation"`
	State             string          `json:"state"`
	StateReason       *string         `json:"state_reason"`
	FencingToken      int64           `json:"fencing_token"`
	CorrelationID     *string         `json:"correlation_id"`
	Fingerprint       *string         `json:"fingerprint"`
	Metadata          json.RawMessage `json:"metadata"`
	AcquiredAt        time.Time       `json:"acquired_at"`
	ExpiresAt         time.Time       `json:"expires_at"`
	Held              bool            `json:"held"`
	Outcome           *outcomeDTO     `json:"outcome"`
	ReleasedAt        *time.Time      `json:"released_at"`
	ReleaseReason     *string         `json:"release_reason"`
	DuplicateAttempts int64           `json:"duplicate_attempts"`
	ConflictAttempts  int64           `json:"conflict_attempts"`
	LeaseExpiresAt    time.Time       `json:"lease_expires_at"`
	OnExpiry          string          `json:"on_expiry"`
	// Lifecycle (docs/reference.md §2 "Lifecycle"; services.Operation).
	RetentionSeconds *int64     `json:"retention_seconds"`
	HorizonSeconds   *int64     `json:"horizon_seconds"`
	EvidenceUntil    *time.Time `json:"evidence_until"`
	ProtectedUntil   *time.Time `json:"protected_until"`
	EvidencePurged   bool       `json:"evidence_purged"`
}

// queuedOperationDTO is one item of the reconciliation queue: the operation object plus the
// queue's sort key (when it became uncertain) and whether a later operation of its key exists,
// so a client sees the order and can tell a superseded operation from the key's newest.
type queuedOperationDTO struct {
	operationDTO
	UncertainAt time.Time `json:"uncertain_at"`
	Superseded  bool      `json:"superseded"`
}

// outcomeDTO is an operation's outcome; RecordedBy and RecordedAt are null in a tombstone,
// which keeps only the status and receipt.
type outcomeDTO struct {
	Status     string          `json:"status"`
	Receipt    *string         `json:"receipt"`
	Response   json.RawMessage `json:"response"`
	Note       *string         `json:"note"`
	RecordedBy *string         `json:"recorded_by"`
	RecordedAt *time.Time      `json:"recorded_at"`
}

type operationDetailDTO struct {
	operationDTO
	Attempts []attemptDTO `json:"attempts"`
	Events   []eventDTO   `json:"events"`
}

type attemptDTO struct {
	ID            int64     `json:"id"`
	Key           string    `json:"key"`
	OperationID   *string   `json:"operation_id"`
	Result        string    `json:"result"`
	AttemptID     *string   `json:"attempt_id"`
	Operation     *string   `json:"operation"`
	Fingerprint   *string   `json:"fingerprint"`
	CorrelationID *string   `json:"correlation_id"`
	Caller        string    `json:"caller"`
	AttemptedAt   time.Time `json:"attempted_at"`
}

type eventDTO struct {
	Kind      string    `json:"kind"`
	Actor     string    `json:"actor"`
	Detail    string    `json:"detail"`
	CreatedAt time.Time `json:"created_at"`
}

type keyDTO struct {
	Key        string        `json:"key"`
	Held       bool          `json:"held"`
	ExpiresAt  *time.Time    `json:"expires_at"`
	AcquiredAt time.Time     `json:"acquired_at"`
	Operation  *operationDTO `json:"operation"`
}

type keyListResponse struct {
	Items      []keyDTO `json:"items"`
	NextCursor *string  `json:"next_cursor"`
}

type operationListResponse struct {
	Items      []queuedOperationDTO `json:"items"`
	NextCursor *string              `json:"next_cursor"`
}

type attemptListResponse struct {
	Items      []attemptDTO `json:"items"`
	NextCursor *string      `json:"next_cursor"`
}

func toOperationDTO(o *services.Operation) operationDTO {
	d := operationDTO{
		ID: o.ID, Key: o.Key, Operation: o.Operation, State: o.State, StateReason: o.StateReason,
		FencingToken: o.FencingToken, CorrelationID: o.CorrelationID, Fingerprint: o.Fingerprint,
		Metadata: o.Metadata, AcquiredAt: o.AcquiredAt, ExpiresAt: o.ExpiresAt, Held: o.Held,
		ReleasedAt: o.ReleasedAt, ReleaseReason: o.ReleaseReason, DuplicateAttempts: o.DuplicateAttempts,
		ConflictAttempts: o.ConflictAttempts, LeaseExpiresAt: o.LeaseExpiresAt, OnExpiry: o.OnExpiry,
		RetentionSeconds: o.RetentionSeconds, HorizonSeconds: o.HorizonSeconds, EvidenceUntil: o.EvidenceUntil,
		ProtectedUntil: o.ProtectedUntil, EvidencePurged: o.EvidencePurged,
	}
	if d.Metadata == nil {
		d.Metadata = json.RawMessage("null")
	}
	if o.Outcome != nil {
		d.Outcome = &outcomeDTO{Status: o.Outcome.Status, Receipt: o.Outcome.Receipt, Response: o.Outcome.Response,
			Note: o.Outcome.Note}
		if !o.EvidencePurged {
			d.Outcome.RecordedBy, d.Outcome.RecordedAt = &o.Outcome.RecordedBy, &o.Outcome.RecordedAt
		}
		if d.Outcome.Response == nil {
			d.Outcome.Response = json.RawMessage("null")
		}
	}
	return d
}

func toAttemptDTO(a *services.Attempt) attemptDTO {
	return attemptDTO{ID: a.ID, Key: a.Key, OperationID: a.OperationID, Result: a.Result, AttemptID: a.AttemptID,
		Operation: a.Operation, Fingerprint: a.Fingerprint, CorrelationID: a.CorrelationID, Caller: a.Caller,
		AttemptedAt: a.AttemptedAt}
}

func toKeyDTO(k *services.KeyView) keyDTO {
	d := keyDTO{Key: k.Key, Held: k.Held, ExpiresAt: k.ExpiresAt, AcquiredAt: k.AcquiredAt}
	if k.Operation != nil {
		op := toOperationDTO(k.Operation)
		d.Operation = &op
	}
	return d
}

func cursorPtr(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}
