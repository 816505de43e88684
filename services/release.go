package services

import (
	"context"
	"errors"
	"time"

	"github.com/idemgate/idemgate/models"
	"gorm.io/gorm"
)

// ReleaseInput is an owner-checked release (docs/reference.md §4 "POST /v1/release"). Reason is optional
// free text of at most 500 characters.
type ReleaseInput struct {
	Key        string
	OwnerToken string
	Reason     *string
}

func (in *ReleaseInput) validate() error {
	var fe []FieldError
	if msg := ValidateKey(in.Key); msg != "" {
		fe = append(fe, FieldError{Field: "key", Message: msg})
	}
	if in.OwnerToken == "" {
		fe = append(fe, FieldError{Field: "owner_token", Message: "must not be empty"})
	} else if msg := validateText(in.OwnerToken, 256, false); msg != "" {
		fe = append(fe, FieldError{Field: "owner_token", Message: msg})
	}
	if in.Reason != nil {
		if msg := validateText(*in.Reason, MaxReasonChars, true); msg != "" {
			fe = append(fe, FieldError{Field: "reason", Message: msg})
		}
	}
	if len(fe) > 0 {
		return invalid(fe...)
	}
	return nil
}

// Release deletes the key's hold by compare on the operation that holds it, only if
// in.OwnerToken owns that hold and no effect is confirmed (docs/reference.md §1.3, §4). The operation
// becomes released. Errors: ErrInvalidRequest; ErrKeyNotHeld (no live hold, e.g. expired);
// ErrNotOwner (the token does not own the current hold, including a hold re-acquired by another
// attempt); ErrEffectConfirmed (succeeded); ErrOutcomeUncertain (uncertain, or its lease lapsed
// within the TTL: docs/reference.md §8); ErrStoreUnavailable. None of the refusals change anything,
// except that an in_progress operation whose lease lapsed is made uncertain
// (lease_expired_without_outcome) in the same transaction before the refusal, as acquire and
// renew do, so the answer does not depend on whether the reaper ran first.
func (a *Admission) Release(ctx context.Context, p Principal, in ReleaseInput) (op *Operation, err error) {
	if err := in.validate(); err != nil {
		return nil, err
	}
	defer func() { observeRelease(ctx, a.obs, SourceAPI, err, operationDecision(in.Key, op)) }()
	var out *Operation
	lapsed := false
	err = a.db.Tx(ctx, func(tx *gorm.DB) error {
		var k models.IdemKey
		err := a.st.lock(tx).Where("tenant_id = ? AND key = ?", p.TenantID, in.Key).Take(&k).Error
		if errors.Is(err, gorm.ErrRecordNotFound) {
			return ErrKeyNotHeld
		} else if err != nil {
			return err
		}
		now, err := a.db.Now(ctx, tx)
		if err != nil {
			return err
		}
		if k.HolderOperationID == nil || !k.ExpiresAt.After(now) {
			return ErrKeyNotHeld
		}
		var h models.Operation
		if err := a.st.lock(tx).Where("id = ?", *k.HolderOperationID).Take(&h).Error; err != nil {
			return err
		}
		if !secretMatches(in.OwnerToken, h.OwnerTokenHash) {
			return ErrNotOwner
		}
		// The lapse is committed (nil from here), then the release refused below.
		if lapsed, err = lapseIfLeaseLapsed(tx, &h, now); lapsed || err != nil {
			return err
		}
		if err := releasable(h.State); err != nil {
			return err
		}
		if err := releaseHold(tx, &h, now, in.Reason, "api:"+p.Prefix); err != nil {
			return err
		}
		out, err = loadOperation(tx, p.TenantID, h.ID, now)
		return err
	})
	if err != nil {
		return nil, storeError("release", err)
	}
	if lapsed {
		err = ErrOutcomeUncertain
		return nil, err
	}
	return out, nil
}

// releaseHold moves h to released and clears the key's hold by compare on h.ID, so it can never
// remove a hold that a newer attempt acquired (docs/reference.md §6).
func releaseHold(tx *gorm.DB, h *models.Operation, now time.Time, reason *string, actor string) error {
	if err := tx.Model(&models.IdemKey{}).
		Where("tenant_id = ? AND key = ? AND holder_operation_id = ?", h.TenantID, h.Key, h.ID).
		Updates(map[string]any{"holder_operation_id": nil, "expires_at": nil}).Error; err != nil {
		return err
	}
	updates := map[string]any{"state": StateReleased, "released_at": now, "release_reason": reason}
	endUpdates(h, now, updates)
	if err := tx.Model(&models.Operation{}).Where("id = ?", h.ID).Updates(updates).Error; err != nil {
		return err
	}
	detail := h.State + " -> released"
	if reason != nil && *reason != "" {
		detail += ": " + *reason
	}
	return tx.Create(&models.Event{OperationID: h.ID, TenantID: h.TenantID, Kind: EventReleased,
		Actor: actor, Detail: detail, CreatedAt: now}).Error
}
