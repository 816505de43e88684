package services

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/idemgate/idemgate/models"
	"gorm.io/gorm"
)

// OutcomeInput records an operation's outcome (docs/reference.md §4 "POST /v1/operations/{id}/outcome").
// Status is succeeded, failed or uncertain. Response is any JSON value of at most 64 KiB,
// stored for replay to duplicates. Release (only with failed) releases the hold in the same
// transaction, if this operation still holds the key; after another attempt took the key over
// the failed outcome is recorded and the state stays failed.
type OutcomeInput struct {
	OwnerToken string
	Status     string
	Receipt    *string
	Response   json.RawMessage
	Note       *string
	Release    bool
}

// validate checks the fields after the owner token has been checked (docs/reference.md §4: a wrong token
// is 403 whatever else is wrong) and returns the compacted response.
func (in *OutcomeInput) validate() (json.RawMessage, error) {
	var fe []FieldError
	add := func(field, msg string) {
		if msg != "" {
			fe = append(fe, FieldError{Field: field, Message: msg})
		}
	}
	switch in.Status {
	case StateSucceeded, StateFailed, StateUncertain:
	case "":
		add("status", "is required: succeeded, failed or uncertain")
	default:
		add("status", "must be succeeded, failed or uncertain")
	}
	if in.Release && in.Status != StateFailed {
		add("release", "may be true only with status failed")
	}
	if in.Receipt != nil {
		add("receipt", validateText(*in.Receipt, MaxReceiptChars, true))
	}
	if in.Note != nil {
		add("note", validateText(*in.Note, MaxNoteChars, true))
	}
	var resp json.RawMessage
	if in.Response != nil {
		r, msg := validateJSON(in.Response, false)
		if msg == "" && len(r) > MaxResponseBytes {
			return nil, &Error{Code: CodePayloadTooLarge,
				Message: fmt.Sprintf("The response must be at most %d bytes serialized; nothing was changed.", MaxResponseBytes)}
		}
		add("response", msg)
		resp = r
	}
	if len(fe) > 0 {
		return nil, invalid(fe...)
	}
	return resp, nil
}

// RecordOutcome records the outcome of operation id in p's tenant, checked by owner token, per
// the state machine of docs/reference.md §3. It works after the hold expired. Recording the same outcome
// again (equal status, receipt and response) succeeds and changes nothing. Errors: ErrNotFound
// (unknown id or another tenant's), ErrNotOwner (checked first), ErrInvalidRequest,
// ErrPayloadTooLarge (response over 64 KiB; nothing changes), ErrInvalidTransition,
// ErrStoreUnavailable.
func (a *Admission) RecordOutcome(ctx context.Context, p Principal, id string, in OutcomeInput) (op *Operation, err error) {
	u, perr := uuid.Parse(id)
	if perr != nil {
		return nil, ErrNotFound
	}
	id = u.String() // the stored spelling: PostgreSQL would match others, SQLite would not
	changed := false
	defer func() { observeOutcome(ctx, a.obs, SourceAPI, in.Status, changed, err, operationDecision("", op)) }()
	var out *Operation
	err = a.db.Tx(ctx, func(tx *gorm.DB) error {
		var op models.Operation
		err := tx.Where("id = ? AND tenant_id = ?", id, p.TenantID).Take(&op).Error
		if errors.Is(err, gorm.ErrRecordNotFound) {
			return ErrNotFound
		} else if err != nil {
			return err
		}
		// Lock in the order acquire, release and the reaper use (key row, then operation), so a
		// release-with-outcome, or a success that protects its key, racing a takeover of the
		// same key cannot deadlock.
		if in.Release {
			if err := a.st.lock(tx).Where("tenant_id = ? AND key = ?", p.TenantID, op.Key).
				Take(&models.IdemKey{}).Error; err != nil {
				return err
			}
		} else if err := lockKeyForHorizon(tx, a.st, &op, in.Status); err != nil {
			return err
		}
		if err := a.st.lock(tx).Where("id = ?", id).Take(&op).Error; err != nil {
			return err
		}
		if !secretMatches(in.OwnerToken, op.OwnerTokenHash) {
			return ErrNotOwner
		}
		resp, err := in.validate()
		if err != nil {
			return err
		}
		now, err := a.db.Now(ctx, tx)
		if err != nil {
			return err
		}
		// docs/reference.md §8: the first write after a lapsed lease records the lapse, and
		// the owner's late outcome is such a write like an acquire, renew or release: its
		// uncertain keeps lease_expired_without_outcome (duplicates 409), its succeeded
		// follows the lapse in the event log.
		if lapsed, err := lapseIfLeaseLapsed(tx, &op, now); err != nil {
			return err
		} else if lapsed {
			if err := tx.Where("id = ?", id).Take(&op).Error; err != nil {
				return err
			}
		}
		if changed, err = applyOutcome(tx, &op, in.Status, in.Receipt, resp, in.Note, in.Release, "api:"+p.Prefix, now); err != nil {
			return err
		}
		out, err = loadOperation(tx, p.TenantID, op.ID, now)
		return err
	})
	if err != nil {
		return nil, storeError("record outcome", err)
	}
	return out, nil
}

// applyOutcome moves op by the state machine of docs/reference.md §3 and writes the outcome and an event.
// It returns ErrInvalidTransition for a refused move and does nothing for a repeat of the same
// outcome; changed reports whether it wrote anything.
func applyOutcome(tx *gorm.DB, op *models.Operation, status string, receipt *string, resp json.RawMessage,
	note *string, release bool, actor string, now time.Time) (changed bool, err error) {
	if release {
		// Only the holder can release. After another attempt took the key over, the failed
		// outcome is still recorded, but the operation stays failed: it released nothing.
		var holds int64
		if err := tx.Model(&models.IdemKey{}).
			Where("tenant_id = ? AND key = ? AND holder_operation_id = ?", op.TenantID, op.Key, op.ID).
			Count(&holds).Error; err != nil {
			return false, err
		}
		release = holds > 0
	}
	same := op.OutcomeStatus != nil && *op.OutcomeStatus == status && sameOptional(op.OutcomeReceipt, receipt) &&
		canonicalJSON(rawJSON(op.OutcomeResponse)) == canonicalJSON(resp)
	move, err := outcomeTransition(op.State, op.OutcomeStatus != nil, same, status, release)
	if err != nil || move == moveNone {
		return false, err
	}
	target := status
	if release {
		target = StateReleased
	}
	updates := map[string]any{
		"state": target, "outcome_status": status, "outcome_receipt": receipt,
		"outcome_response": jsonArg(resp), "outcome_note": note, "outcome_by": actor, "outcome_at": now,
	}
	if move == moveReleaseFailed { // failed -> released keeps the recorded outcome
		updates = map[string]any{}
	}
	if target != StateUncertain {
		updates["state"] = target
		updates["state_reason"] = nil
		endUpdates(op, now, updates)
	}
	if err := tx.Model(&models.Operation{}).Where("id = ?", op.ID).Updates(updates).Error; err != nil {
		return false, err
	}
	if target == StateSucceeded && op.HorizonSeconds != nil {
		if err := protectKey(tx, op, now); err != nil {
			return false, err
		}
	}
	if move == moveRecord {
		detail := fmt.Sprintf("%s -> %s: outcome %s", op.State, status, status)
		if receipt != nil && *receipt != "" {
			detail += ", receipt " + *receipt
		}
		if err := tx.Create(&models.Event{OperationID: op.ID, TenantID: op.TenantID, Kind: EventOutcome,
			Actor: actor, Detail: detail, CreatedAt: now}).Error; err != nil {
			return false, err
		}
	}
	if release {
		reason := "released with failed outcome"
		if note != nil && *note != "" {
			reason = *note
		}
		op.State = StateFailed
		return true, releaseHold(tx, op, now, &reason, actor)
	}
	return true, nil
}
