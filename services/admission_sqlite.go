package services

import (
	"context"
	"encoding/json"
	"errors"
	"time"

	"github.com/idemgate/idemgate/models"
	"gorm.io/gorm"
)

// acquireSQLite is the SQLite twin of the PostgreSQL function idemgate_acquire: the same
// decision, step for step, as one immediate transaction (the DSN sets _txlock=immediate, so the
// write lock is taken at BEGIN and concurrent acquires queue on busy_timeout instead of racing).
func (a *Admission) acquireSQLite(ctx context.Context, p Principal, in AcquireInput, meta json.RawMessage, opID, ownerHash string, row *acquireRow) error {
	return a.db.Tx(ctx, func(tx *gorm.DB) error {
		now := time.Now().UTC().Truncate(time.Microsecond)
		expires := now.Add(time.Duration(in.TTLSeconds) * time.Second)
		newOp := models.Operation{
			ID: opID, TenantID: p.TenantID, Key: in.Key, OperationName: in.Operation,
			Fingerprint: in.Fingerprint, CorrelationID: in.CorrelationID, AttemptID: in.AttemptID,
			APIKeyID: &p.APIKeyID, Metadata: jsonArg(meta), State: StateInProgress, OwnerTokenHash: ownerHash,
			AcquiredAt: now, ExpiresAt: expires,
		}
		row.DBNow = now
		var k models.IdemKey
		err := tx.Where("tenant_id = ? AND key = ?", p.TenantID, in.Key).Take(&k).Error
		switch {
		case errors.Is(err, gorm.ErrRecordNotFound):
			newOp.FencingToken = 1
			k = models.IdemKey{TenantID: p.TenantID, Key: in.Key, FencingToken: 1, HolderOperationID: &opID,
				ExpiresAt: &expires, LastOperationID: opID, AcquiredAt: now}
			if err := tx.Create(&k).Error; err != nil {
				return err
			}
			if err := tx.Create(&newOp).Error; err != nil {
				return err
			}
			row.Result = ResultAdmitted
		case err != nil:
			return err
		case k.HolderOperationID != nil && k.ExpiresAt.After(now):
			var h models.Operation
			if err := tx.Where("id = ?", *k.HolderOperationID).Take(&h).Error; err != nil {
				return err
			}
			newOp = h
			switch {
			case !sameOptional(h.OperationName, in.Operation) || !sameOptional(h.Fingerprint, in.Fingerprint):
				row.Result = ResultConflict
				if err := tx.Model(&models.Operation{}).Where("id = ?", h.ID).
					Update("conflict_attempts", gorm.Expr("conflict_attempts + 1")).Error; err != nil {
					return err
				}
			case in.AttemptID != nil && h.AttemptID != nil && *h.AttemptID == *in.AttemptID &&
				h.APIKeyID != nil && *h.APIKeyID == p.APIKeyID && h.State == StateInProgress:
				// Only the creating API key's retry, and only while the effect may still be
				// running, gets its operation back (see Acquire); the immediate transaction
				// keeps the state we read current.
				if err := tx.Model(&models.Operation{}).Where("id = ?", h.ID).
					Update("owner_token_hash", ownerHash).Error; err != nil {
					return err
				}
				row.Result, row.Readmitted = ResultAdmitted, true
			default:
				row.Result = ResultDuplicate
				if err := tx.Model(&models.Operation{}).Where("id = ?", h.ID).
					Update("duplicate_attempts", gorm.Expr("duplicate_attempts + 1")).Error; err != nil {
					return err
				}
			}
		default:
			if k.HolderOperationID != nil {
				if err := markExpiredUncertain(tx, p.TenantID, *k.HolderOperationID, now); err != nil {
					return err
				}
			}
			var prev models.Operation
			if err := tx.Where("id = ?", k.LastOperationID).Take(&prev).Error; err == nil {
				row.PrevID, row.PrevState, row.PrevFencingToken = &prev.ID, &prev.State, &prev.FencingToken
				row.PrevOutcomeStatus, row.PrevOutcomeReceipt = prev.OutcomeStatus, prev.OutcomeReceipt
			} else if !errors.Is(err, gorm.ErrRecordNotFound) {
				return err
			}
			newOp.FencingToken = k.FencingToken + 1
			if err := tx.Model(&models.IdemKey{}).Where("id = ?", k.ID).Updates(map[string]any{
				"fencing_token": newOp.FencingToken, "holder_operation_id": opID, "expires_at": expires,
				"last_operation_id": opID, "acquired_at": now,
			}).Error; err != nil {
				return err
			}
			if err := tx.Create(&newOp).Error; err != nil {
				return err
			}
			row.Result = ResultAdmitted
		}
		if err := tx.Create(&models.Attempt{
			TenantID: p.TenantID, Key: in.Key, OperationID: &newOp.ID, Result: row.Result,
			AttemptID: in.AttemptID, OperationName: in.Operation, Fingerprint: in.Fingerprint,
			CorrelationID: in.CorrelationID, Caller: p.Prefix, AttemptedAt: now,
		}).Error; err != nil {
			return err
		}
		var op models.Operation
		if err := tx.Where("id = ?", newOp.ID).Take(&op).Error; err != nil {
			return err
		}
		fillOpColumns(row, &op)
		return nil
	})
}

// markExpiredUncertain applies SPEC.md §3: an operation whose hold expired while in_progress
// becomes uncertain (reason ttl_expired_without_outcome), with an event. The caller has
// established that the hold expired; the state compare makes this a no-op otherwise.
func markExpiredUncertain(tx *gorm.DB, tenantID int64, opID string, now time.Time) error {
	res := tx.Model(&models.Operation{}).Where("id = ? AND state = ?", opID, StateInProgress).
		Updates(map[string]any{"state": StateUncertain, "state_reason": ReasonTTLExpired})
	if res.Error != nil || res.RowsAffected == 0 {
		return res.Error
	}
	return tx.Create(&models.Event{OperationID: opID, TenantID: tenantID, Kind: EventStateChanged,
		Actor: ActorSystem, Detail: "in_progress -> uncertain: " + ReasonTTLExpired, CreatedAt: now}).Error
}

// Event kinds, actors and reasons written to the event log.
const (
	EventStateChanged = "state_changed"
	EventOutcome      = "outcome_recorded"
	EventReleased     = "released"
	ActorSystem       = "system"
	ReasonTTLExpired  = "ttl_expired_without_outcome"
)

func fillOpColumns(row *acquireRow, op *models.Operation) {
	row.OpID, row.OpKey, row.OpOperationName, row.OpFingerprint = op.ID, op.Key, op.OperationName, op.Fingerprint
	row.OpCorrelationID, row.OpMetadata, row.OpState, row.OpStateReason = op.CorrelationID, op.Metadata, op.State, op.StateReason
	row.OpFencingToken, row.OpAcquiredAt, row.OpExpiresAt = op.FencingToken, op.AcquiredAt, op.ExpiresAt
	row.OpOutcomeStatus, row.OpOutcomeReceipt, row.OpOutcomeResponse = op.OutcomeStatus, op.OutcomeReceipt, op.OutcomeResponse
	row.OpOutcomeNote, row.OpOutcomeBy, row.OpOutcomeAt = op.OutcomeNote, op.OutcomeBy, op.OutcomeAt
	row.OpReleasedAt, row.OpReleaseReason = op.ReleasedAt, op.ReleaseReason
	row.OpDuplicateAttempts, row.OpConflictAttempts = op.DuplicateAttempts, op.ConflictAttempts
}

func sameOptional(a, b *string) bool {
	if a == nil || b == nil {
		return a == nil && b == nil
	}
	return *a == *b
}
