package services

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/idemgate/idemgate/models"
	"gorm.io/gorm"
)

// Reconciliation carries out operators' actions on operations (the dashboard's forms): record
// a confirmed outcome of an in_progress or uncertain operation, and owner-checked release.
// Every action is checked against the account's role and tenant, recorded under the
// operator's username, and reported to the Observer. Safe for concurrent use.
type Reconciliation struct {
	reader
	obs Observer
}

// NewReconciliation returns a Reconciliation over db that reports to nobody; see WithObserver.
func NewReconciliation(db *models.DB) *Reconciliation {
	return &Reconciliation{reader: reader{db: db, st: newStore(db)}, obs: nopObserver{}}
}

// HolderInfo is the operation whose hold is on a key right now (the key row's holder), as the
// dashboard names it. AttemptID is the caller's attempt_id, nil when it sent none. ExpiresAt may
// be in the past: the hold expired and no acquire or reaper pass has cleared it yet.
type HolderInfo struct {
	OperationID  string
	FencingToken int64
	AttemptID    *string
	AcquiredAt   time.Time
	ExpiresAt    time.Time
}

// HeldByAnotherError refuses an operator release because another operation holds the key now:
// the operator saw an older generation (docs/reference.md §5 "Owner-checked release"). Nothing was
// changed. errors.Is(err, ErrNotOwner) is true and errors.As finds an *Error with code
// not_owner, so it maps to 409 like any not_owner refusal; Holder names the hold to show.
type HeldByAnotherError struct {
	Holder HolderInfo
}

// Error names the holder.
func (e *HeldByAnotherError) Error() string {
	return e.asError().Error()
}

// Is matches ErrNotOwner (any *Error with code not_owner).
func (e *HeldByAnotherError) Is(target error) bool {
	t, ok := target.(*Error)
	return ok && t.Code == CodeNotOwner
}

// Unwrap returns the equivalent *Error, for callers that map errors by code.
func (e *HeldByAnotherError) Unwrap() error { return e.asError() }

func (e *HeldByAnotherError) asError() *Error {
	msg := fmt.Sprintf("The key is now held by operation %s (fencing token %d", e.Holder.OperationID, e.Holder.FencingToken)
	if e.Holder.AttemptID != nil {
		msg += ", attempt " + *e.Holder.AttemptID
	}
	return &Error{Code: CodeNotOwner, Message: msg + "); nothing was changed."}
}

// ReconcileInput is an operator's confirmed outcome (docs/reference.md §5 "Record confirmed outcome").
// Status is succeeded or failed; Receipt is optional (at most 512 characters); Note is
// mandatory (1 to 1000 characters) and says how the operator knows.
type ReconcileInput struct {
	Status  string
	Receipt *string
	Note    string
}

func (in *ReconcileInput) validate() error {
	var fe []FieldError
	switch in.Status {
	case StateSucceeded, StateFailed:
	case "":
		fe = append(fe, FieldError{Field: "status", Message: "is required: succeeded or failed"})
	default:
		fe = append(fe, FieldError{Field: "status", Message: "must be succeeded or failed"})
	}
	if in.Receipt != nil {
		if msg := validateText(*in.Receipt, MaxReceiptChars, true); msg != "" {
			fe = append(fe, FieldError{Field: "receipt", Message: msg})
		}
	}
	if msg := requiredText(in.Note, MaxNoteChars); msg != "" {
		fe = append(fe, FieldError{Field: "note", Message: msg})
	}
	if len(fe) > 0 {
		return invalid(fe...)
	}
	return nil
}

// OperatorReleaseInput is an operator's owner-checked release (docs/reference.md §5): OperationID and
// FencingToken are what the operator saw on the page; Reason is mandatory (1 to 500
// characters).
type OperatorReleaseInput struct {
	OperationID  string
	FencingToken int64
	Reason       string
}

// validate checks in against the operation id of the URL (already normalised).
func (in *OperatorReleaseInput) validate(id string) error {
	var fe []FieldError
	if u, err := uuid.Parse(in.OperationID); err != nil || u.String() != id {
		fe = append(fe, FieldError{Field: "operation_id", Message: "must be the id of the operation being released"})
	}
	if in.FencingToken < 1 {
		fe = append(fe, FieldError{Field: "fencing_token", Message: "must be a positive integer"})
	}
	if msg := requiredText(in.Reason, MaxReasonChars); msg != "" {
		fe = append(fe, FieldError{Field: "reason", Message: msg})
	}
	if len(fe) > 0 {
		return invalid(fe...)
	}
	return nil
}

// requiredText checks a mandatory free-text field; whitespace alone does not count as text.
func requiredText(s string, max int) string {
	if strings.TrimSpace(s) == "" {
		return "is required"
	}
	return validateText(s, max, false)
}

// canAct reports whether acct may record outcomes and release keys (docs/reference.md §5): admins and
// operators; auditors are read-only.
func canAct(acct *OperatorAccount) error {
	if MayAct(acct) {
		return nil
	}
	return &Error{Code: CodeUnauthorized, Message: "This account is read-only; only admins and operators may act on operations."}
}

// CheckMayAct refuses acct's state-changing requests on operation id in the order that keeps
// existence from leaking: an operation the account may not see (a malformed or unknown id, or
// another tenant's for a tenant-restricted account) is ErrNotFound whatever the role, and only a
// visible one is refused as read-only (ErrUnauthorized, auditors). Admins and operators pass
// without a query; the action itself checks the tenant again. Errors: ErrNotFound,
// ErrUnauthorized, ErrStoreUnavailable.
func (rc *Reconciliation) CheckMayAct(ctx context.Context, acct *OperatorAccount, id string) error {
	readOnly := canAct(acct)
	if readOnly == nil {
		return nil
	}
	id, err := normaliseID(id)
	if err != nil {
		return err
	}
	if acct == nil {
		return readOnly
	}
	if _, err := rc.operatorOpRow(rc.db.WithContext(ctx), acct, id); err != nil {
		return storeError("check operator", err)
	}
	return readOnly
}

// operatorOpRow reads operation id (already normalised) as acct may see it. A tenant-restricted
// account gets ErrNotFound for other tenants' operations, exactly as for unknown ids, so
// existence does not leak.
func (r *reader) operatorOpRow(tx *gorm.DB, acct *OperatorAccount, id string) (*models.Operation, error) {
	q := tx.Where("id = ?", id)
	if acct.TenantID != nil {
		q = q.Where("tenant_id = ?", *acct.TenantID)
	}
	var op models.Operation
	err := q.Take(&op).Error
	if errors.Is(err, gorm.ErrRecordNotFound) {
		return nil, ErrNotFound
	}
	return &op, err
}

// normaliseID parses an operation id from a URL; anything that is not a UUID is ErrNotFound.
func normaliseID(id string) (string, error) {
	u, err := uuid.Parse(id)
	if err != nil {
		return "", ErrNotFound
	}
	return u.String(), nil // the stored spelling: PostgreSQL would match others, SQLite would not
}

// holderInfo describes the hold on k, which must have a holder.
func holderInfo(tx *gorm.DB, k *models.IdemKey) (*HolderInfo, error) {
	h := &HolderInfo{OperationID: *k.HolderOperationID, FencingToken: k.FencingToken, AcquiredAt: k.AcquiredAt.UTC()}
	if k.ExpiresAt != nil {
		h.ExpiresAt = k.ExpiresAt.UTC()
	}
	var ops []models.Operation
	if err := tx.Select("id", "attempt_id").Where("id = ?", h.OperationID).Limit(1).Find(&ops).Error; err != nil {
		return nil, err
	}
	if len(ops) == 1 {
		h.AttemptID = ops[0].AttemptID
	}
	return h, nil
}

// ReconcileOutcome records an operator's confirmed outcome of operation id (docs/reference.md §3 and §5):
// in_progress or uncertain becomes succeeded or failed, recorded as the operator's username,
// with an event in the same transaction. The hold is left alone: a succeeded operation keeps
// answering duplicates until its TTL, and releasing a failed one is a separate, owner-checked
// step. An outcome response the caller stored earlier is kept. Errors: ErrNotFound (as
// OperationForOperator, checked first: see CheckMayAct), ErrUnauthorized (an auditor:
// read-only), ErrInvalidRequest (bad status,
// receipt over 512 characters, missing or over-long note), ErrInvalidTransition (any other
// state; recording the same status and receipt again succeeds and changes nothing),
// ErrStoreUnavailable.
func (rc *Reconciliation) ReconcileOutcome(ctx context.Context, acct *OperatorAccount, id string, in ReconcileInput) (out *Operation, err error) {
	if err := rc.CheckMayAct(ctx, acct, id); err != nil {
		return nil, err
	}
	id, err = normaliseID(id)
	if err != nil {
		return nil, err
	}
	if err := in.validate(); err != nil {
		return nil, err
	}
	changed := false
	defer func() {
		observeOutcome(ctx, rc.obs, SourceOperator, in.Status, changed, err, operationDecision("", out))
	}()
	err = rc.db.Tx(ctx, func(tx *gorm.DB) error {
		seen, err := rc.operatorOpRow(tx, acct, id)
		if err != nil {
			return err
		}
		if err := lockKeyForHorizon(tx, rc.st, seen, in.Status); err != nil {
			return err
		}
		var op models.Operation
		if err := rc.st.lock(tx).Where("id = ?", id).Take(&op).Error; err != nil {
			return err
		}
		now, err := rc.db.Now(ctx, tx)
		if err != nil {
			return err
		}
		if !reconcilable(op.State) {
			if op.OutcomeStatus != nil && *op.OutcomeStatus == in.Status && sameOptional(op.OutcomeReceipt, in.Receipt) {
				// docs/reference.md §3: the same outcome again succeeds and changes nothing (a form
				// submitted twice, two operators agreeing).
				out, err = loadOperation(tx, op.TenantID, id, now)
				return err
			}
			return &Error{Code: CodeInvalidTransition, Message: fmt.Sprintf(
				"The operation is %s; an outcome can be recorded only while it is in_progress or uncertain.", op.State)}
		}
		note := in.Note
		if changed, err = applyOutcome(tx, &op, in.Status, in.Receipt, rawJSON(op.OutcomeResponse), &note, false,
			acct.Username, now); err != nil {
			return err
		}
		out, err = loadOperation(tx, op.TenantID, id, now)
		return err
	})
	if err != nil {
		return nil, storeError("reconcile outcome", err)
	}
	return out, nil
}

// OperatorRelease releases operation id's hold on its key for an operator (docs/reference.md §5
// "Owner-checked release"), only if that operation still holds the key with the fencing token
// the operator saw, and its state is in_progress or failed. The hold is cleared by compare on
// the operation id (releaseHold), the operation becomes released, and an event names the
// operator. A hold that expired but has not been cleared yet (no takeover, no reaper pass) is
// releasable: the operator is explicitly cleaning up, and clearing it changes nothing another
// attempt relies on.
//
// Errors, none of which change anything: ErrNotFound (as OperationForOperator, checked first:
// see CheckMayAct), ErrUnauthorized (an auditor), ErrInvalidRequest (operation_id not the URL's, fencing token not
// positive, missing or over-long reason), *HeldByAnotherError (another operation holds the key
// now; errors.Is ErrNotOwner), ErrKeyNotHeld (nobody holds the key), ErrNotOwner (this
// operation holds the key under another fencing token than the operator saw),
// ErrEffectConfirmed (succeeded), ErrOutcomeUncertain (uncertain: reconcile first; also an
// in_progress operation whose lease lapsed within its TTL, which is made uncertain,
// lease_expired_without_outcome, in the same transaction first, as acquire, renew and the API
// release do: docs/reference.md §8), ErrInvalidTransition (already released), ErrStoreUnavailable.
func (rc *Reconciliation) OperatorRelease(ctx context.Context, acct *OperatorAccount, id string, in OperatorReleaseInput) (out *Operation, err error) {
	if err := rc.CheckMayAct(ctx, acct, id); err != nil {
		return nil, err
	}
	id, err = normaliseID(id)
	if err != nil {
		return nil, err
	}
	if err := in.validate(id); err != nil {
		return nil, err
	}
	defer func() { observeRelease(ctx, rc.obs, SourceOperator, err, operationDecision("", out)) }()
	lapsed := false
	err = rc.db.Tx(ctx, func(tx *gorm.DB) error {
		seen, err := rc.operatorOpRow(tx, acct, id)
		if err != nil {
			return err
		}
		// Key row first, then the operation: the order acquire, release and the reaper lock in,
		// so a release racing a takeover of the same key waits instead of deadlocking.
		var k models.IdemKey
		err = rc.st.lock(tx).Where("tenant_id = ? AND key = ?", seen.TenantID, seen.Key).Take(&k).Error
		if errors.Is(err, gorm.ErrRecordNotFound) {
			return ErrKeyNotHeld
		} else if err != nil {
			return err
		}
		var op models.Operation
		if err := rc.st.lock(tx).Where("id = ?", id).Take(&op).Error; err != nil {
			return err
		}
		now, err := rc.db.Now(ctx, tx)
		if err != nil {
			return err
		}
		switch {
		case k.HolderOperationID == nil:
			return &Error{Code: CodeKeyNotHeld, Message: "Nobody holds the key any more; nothing was changed."}
		case *k.HolderOperationID != id:
			if k.ExpiresAt == nil || !k.ExpiresAt.After(now) {
				// The newer holder's hold ran out too: nobody holds the key, and the next
				// acquire takes it over.
				return &Error{Code: CodeKeyNotHeld, Message: "Nobody holds the key any more; nothing was changed."}
			}
			h, err := holderInfo(tx, &k)
			if err != nil {
				return err
			}
			return &HeldByAnotherError{Holder: *h}
		case k.FencingToken != in.FencingToken || op.FencingToken != in.FencingToken:
			return &Error{Code: CodeNotOwner, Message: fmt.Sprintf(
				"The operation holds the key with fencing token %d, not %d; reload the page. Nothing was changed.",
				k.FencingToken, in.FencingToken)}
		}
		if holdIsLive(k.HolderOperationID, k.ExpiresAt, now) {
			// A lease that lapsed within the TTL: uncertain now, committed (nil from here),
			// and the release refused below. A hold past its TTL stays releasable (above).
			if lapsed, err = lapseIfLeaseLapsed(tx, &op, now); lapsed || err != nil {
				return err
			}
		}
		if err := releasable(op.State); err != nil {
			return err
		}
		reason := in.Reason
		if err := releaseHold(tx, &op, now, &reason, acct.Username); err != nil {
			return err
		}
		out, err = loadOperation(tx, op.TenantID, id, now)
		return err
	})
	if err != nil {
		return nil, storeError("operator release", err)
	}
	if lapsed {
		err = ErrOutcomeUncertain
		return nil, err
	}
	return out, nil
}
