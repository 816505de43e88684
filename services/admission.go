package services

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"time"

	"github.com/google/uuid"
	"github.com/idemgate/idemgate/models"
)

// DefaultMaxTTL is the largest ttl_seconds accepted unless configured otherwise (SPEC.md §4).
const DefaultMaxTTL = 30 * 24 * time.Hour

// Admission decides admission and records outcomes and releases (SPEC.md §3–4). It is safe for
// concurrent use by any number of goroutines and server processes sharing one database.
type Admission struct {
	db     *models.DB
	log    *slog.Logger
	maxTTL time.Duration
}

// NewAdmission returns an Admission over db. maxTTL bounds ttl_seconds (0 means
// DefaultMaxTTL).
func NewAdmission(db *models.DB, log *slog.Logger, maxTTL time.Duration) *Admission {
	if maxTTL <= 0 {
		maxTTL = DefaultMaxTTL
	}
	return &Admission{db: db, log: log, maxTTL: maxTTL}
}

// MaxTTL returns the largest TTL acquire accepts.
func (a *Admission) MaxTTL() time.Duration { return a.maxTTL }

// AcquireInput is an acquire request (SPEC.md §4 "POST /v1/acquire"). Nil pointers are absent
// fields. Metadata, when set, must be a JSON object.
type AcquireInput struct {
	Key           string
	TTLSeconds    int64
	Operation     *string
	Fingerprint   *string
	CorrelationID *string
	AttemptID     *string
	Metadata      json.RawMessage
}

// validate checks in against SPEC.md's limits and returns the compacted metadata. All field
// problems are reported at once.
func (in *AcquireInput) validate(maxTTL time.Duration) (json.RawMessage, error) {
	var fe []FieldError
	add := func(field, msg string) {
		if msg != "" {
			fe = append(fe, FieldError{Field: field, Message: msg})
		}
	}
	add("key", ValidateKey(in.Key))
	maxSecs := int64(maxTTL / time.Second)
	if in.TTLSeconds < 1 || in.TTLSeconds > maxSecs {
		add("ttl_seconds", fmt.Sprintf("must be an integer from 1 to %d", maxSecs))
	}
	if in.Operation != nil {
		add("operation", ValidateOperationName(*in.Operation))
	}
	if in.Fingerprint != nil {
		add("fingerprint", validateText(*in.Fingerprint, MaxFingerprintChars, false))
	}
	if in.CorrelationID != nil {
		add("correlation_id", validateText(*in.CorrelationID, MaxCorrelationIDChars, false))
	}
	if in.AttemptID != nil {
		add("attempt_id", validateText(*in.AttemptID, MaxAttemptIDChars, false))
	}
	var meta json.RawMessage
	if in.Metadata != nil && string(in.Metadata) != "null" {
		m, msg := validateJSON(in.Metadata, true)
		if msg == "" && len(m) > MaxMetadataBytes {
			msg = fmt.Sprintf("must be at most %d bytes serialized", MaxMetadataBytes)
		}
		add("metadata", msg)
		meta = m
	}
	if len(fe) > 0 {
		return nil, invalid(fe...)
	}
	return meta, nil
}

// acquireRow is the admission decision as both dialects report it; on PostgreSQL it is the row
// returned by the idemgate_acquire function (models/migrations/postgres/00002).
type acquireRow struct {
	Result              string
	Readmitted          bool
	DBNow               time.Time `gorm:"column:db_now"`
	PrevID              *string
	PrevState           *string
	PrevFencingToken    *int64
	PrevOutcomeStatus   *string
	OpID                string
	OpKey               string
	OpOperationName     *string
	OpFingerprint       *string
	OpCorrelationID     *string
	OpMetadata          *string
	OpState             string
	OpStateReason       *string
	OpFencingToken      int64
	OpAcquiredAt        time.Time
	OpExpiresAt         time.Time
	OpOutcomeStatus     *string
	OpOutcomeReceipt    *string
	OpOutcomeResponse   *string
	OpOutcomeNote       *string
	OpOutcomeBy         *string
	OpOutcomeAt         *time.Time
	OpReleasedAt        *time.Time
	OpReleaseReason     *string
	OpDuplicateAttempts int64
	OpConflictAttempts  int64
}

// Acquire asks whether this attempt may run the operation named by in.Key in p's tenant
// (SPEC.md §4). It returns an Acquisition with Admitted true (201) for a free key or an
// attempt_id retry, Admitted false with the holder's Operation for a duplicate (200), or an
// error: ErrInvalidRequest with Fields, ErrFingerprintMismatch (422) for a held key with a
// different fingerprint or operation name, ErrStoreUnavailable. Every call that passes
// validation is logged as an attempt in the same transaction as the decision.
func (a *Admission) Acquire(ctx context.Context, p Principal, in AcquireInput) (*Acquisition, error) {
	meta, err := in.validate(a.maxTTL)
	if err != nil {
		return nil, err
	}
	owner := newSecret(ownerTokenPrefix)
	opID := uuid.NewString()
	var row acquireRow
	if a.db.Dialect == models.Postgres {
		err = a.acquirePostgres(ctx, p, in, meta, opID, hashSecret(owner), &row)
	} else {
		err = a.acquireSQLite(ctx, p, in, meta, opID, hashSecret(owner), &row)
	}
	if err != nil {
		return nil, storeError("acquire", err)
	}
	switch row.Result {
	case models.ResultConflict:
		return nil, ErrFingerprintMismatch
	case models.ResultDuplicate:
		op := row.operation()
		return &Acquisition{Admitted: false, Key: in.Key, Operation: &op}, nil
	}
	acq := &Acquisition{
		Admitted:     true,
		Readmitted:   row.Readmitted,
		Key:          in.Key,
		OperationID:  row.OpID,
		OwnerToken:   owner,
		FencingToken: row.OpFencingToken,
		State:        row.OpState,
		ExpiresAt:    row.OpExpiresAt.UTC(),
	}
	if row.PrevID != nil && row.PrevState != nil &&
		(*row.PrevState == models.StateUncertain || *row.PrevState == models.StateSucceeded) {
		acq.PreviousOperation = &PreviousOperation{
			ID: *row.PrevID, State: *row.PrevState, FencingToken: deref(row.PrevFencingToken),
			OutcomeStatus: row.PrevOutcomeStatus,
		}
	}
	return acq, nil
}

const acquireSQL = `SELECT * FROM idemgate_acquire(?, ?, ?, ?, ?, ?, ?::json, ?, ?, ?::uuid, ?)`

func (a *Admission) acquirePostgres(ctx context.Context, p Principal, in AcquireInput, meta json.RawMessage, opID, ownerHash string, row *acquireRow) error {
	res := a.db.WithContext(ctx).Raw(acquireSQL,
		p.TenantID, in.Key, in.TTLSeconds, in.Operation, in.Fingerprint, in.CorrelationID,
		jsonArg(meta), in.AttemptID, p.Prefix, opID, ownerHash).Scan(row)
	if res.Error != nil {
		return res.Error
	}
	if res.RowsAffected != 1 {
		return fmt.Errorf("idemgate_acquire returned %d rows", res.RowsAffected)
	}
	return nil
}

func (r *acquireRow) operation() Operation {
	op := Operation{
		ID: r.OpID, Key: r.OpKey, Operation: r.OpOperationName, State: r.OpState,
		StateReason: r.OpStateReason, FencingToken: r.OpFencingToken, CorrelationID: r.OpCorrelationID,
		Fingerprint: r.OpFingerprint, Metadata: rawJSON(r.OpMetadata), AcquiredAt: r.OpAcquiredAt.UTC(),
		ExpiresAt: r.OpExpiresAt.UTC(), Held: true, ReleasedAt: utcPtr(r.OpReleasedAt),
		ReleaseReason: r.OpReleaseReason, DuplicateAttempts: r.OpDuplicateAttempts,
		ConflictAttempts: r.OpConflictAttempts,
	}
	if r.OpOutcomeStatus != nil {
		op.Outcome = &Outcome{
			Status: *r.OpOutcomeStatus, Receipt: r.OpOutcomeReceipt, Response: rawJSON(r.OpOutcomeResponse),
			Note: r.OpOutcomeNote, RecordedBy: deref(r.OpOutcomeBy), RecordedAt: derefTime(r.OpOutcomeAt),
		}
	}
	return op
}

func deref[T any](p *T) T {
	var zero T
	if p == nil {
		return zero
	}
	return *p
}

func derefTime(t *time.Time) time.Time {
	if t == nil {
		return time.Time{}
	}
	return t.UTC()
}

func utcPtr(t *time.Time) *time.Time {
	if t == nil {
		return nil
	}
	u := t.UTC()
	return &u
}

func rawJSON(s *string) json.RawMessage {
	if s == nil {
		return nil
	}
	return json.RawMessage(*s)
}

// jsonArg passes raw JSON as a text parameter (or NULL), which both drivers accept for
// jsonb/text columns.
func jsonArg(raw json.RawMessage) *string {
	if raw == nil {
		return nil
	}
	s := string(raw)
	return &s
}
