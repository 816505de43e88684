package services

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/idemgate/idemgate/models"
	"gorm.io/gorm"
)

// RenewInput is a lease renewal, the owner's heartbeat (docs/reference.md §8 "POST
// /v1/operations/{id}/renew"). LeaseSeconds (1 to the configured maximum TTL, in seconds) is
// the new lease from now.
// ExtendTTL lets the lease run past the protection window, which then moves to at least the
// new lease end; without it the lease is capped at the window's end.
type RenewInput struct {
	OwnerToken   string
	LeaseSeconds int64
	ExtendTTL    bool
}

// Validate checks in's fields other than the owner token (which Renew checks first, as an
// outcome does: a wrong token is 403 whatever else is wrong). maxTTL is the configured maximum
// TTL (NewAdmission): lease_seconds is bounded by it as an acquire's ttl_seconds is, so that
// extend_ttl never moves a protection window further from now than an acquire may set one.
// Errors: ErrInvalidRequest with Fields.
func (in *RenewInput) Validate(maxTTL time.Duration) error {
	maxSecs := ttlCeilingSeconds(maxTTL)
	if in.LeaseSeconds < 1 || in.LeaseSeconds > maxSecs {
		return invalid(FieldError{Field: "lease_seconds", Message: fmt.Sprintf("must be an integer from 1 to %d", maxSecs)})
	}
	return nil
}

// Renewal is the answer to a renew: the operation's new lease end, its (maybe moved)
// protection window and its fencing token.
type Renewal struct {
	OperationID    string
	LeaseExpiresAt time.Time
	ExpiresAt      time.Time
	FencingToken   int64
}

// Renew extends the lease of operation id in p's tenant (docs/reference.md §8). It is owner
// checked and fenced: in one transaction it locks the key row, then the operation row (the
// order acquire, release and outcome use), and renews only if the token owns the operation, the
// operation is still in_progress, still holds its key, and its lease has not lapsed. A late
// renew therefore never changes a lease. Errors: ErrNotFound (unknown id, another tenant's),
// ErrNotOwner (checked first), ErrInvalidRequest, ErrLeaseExpired (the lease lapsed: the
// operation is, or by this call becomes, uncertain; the lease is not changed),
// ErrInvalidTransition (the operation has an outcome or was released), ErrStoreUnavailable.
func (a *Admission) Renew(ctx context.Context, p Principal, id string, in RenewInput) (*Renewal, error) {
	u, perr := uuid.Parse(id)
	if perr != nil {
		return nil, ErrNotFound
	}
	id = u.String()
	var out *Renewal
	lapsed := false
	err := a.db.Tx(ctx, func(tx *gorm.DB) error {
		var op models.Operation
		err := tx.Where("id = ? AND tenant_id = ?", id, p.TenantID).Take(&op).Error
		if errors.Is(err, gorm.ErrRecordNotFound) {
			return ErrNotFound
		} else if err != nil {
			return err
		}
		var k models.IdemKey
		if err := a.st.lock(tx).Where("tenant_id = ? AND key = ?", p.TenantID, op.Key).Take(&k).Error; err != nil {
			return err
		}
		if err := a.st.lock(tx).Where("id = ?", id).Take(&op).Error; err != nil {
			return err
		}
		if !secretMatches(in.OwnerToken, op.OwnerTokenHash) {
			return ErrNotOwner
		}
		if err := in.Validate(a.maxTTL); err != nil {
			return err
		}
		now, err := a.db.Now(ctx, tx)
		if err != nil {
			return err
		}
		switch {
		case op.State == StateUncertain && !op.LeaseEnd().After(now):
			return ErrLeaseExpired
		case op.State != StateInProgress:
			return ErrInvalidTransition
		case k.HolderOperationID == nil || *k.HolderOperationID != op.ID || !op.LeaseEnd().After(now):
			// Lapsed, maybe taken over: it becomes uncertain now (if nobody made it so yet),
			// committed, and the renew is refused.
			lapsed = true
			_, err := expireToUncertain(tx, p.TenantID, op.ID, now)
			return err
		}
		lease := now.Add(time.Duration(in.LeaseSeconds) * time.Second)
		expires := op.ExpiresAt
		updates := map[string]any{}
		if in.ExtendTTL {
			if lease.After(expires) {
				expires = lease
				updates["expires_at"] = expires
				if err := tx.Model(&models.IdemKey{}).Where("id = ? AND holder_operation_id = ?", k.ID, op.ID).
					Update("expires_at", expires).Error; err != nil {
					return err
				}
			}
		} else if lease.After(expires) {
			lease = expires
		}
		updates["lease_expires_at"] = lease
		if err := tx.Model(&models.Operation{}).Where("id = ? AND state = ?", op.ID, StateInProgress).
			Updates(updates).Error; err != nil {
			return err
		}
		out = &Renewal{OperationID: op.ID, LeaseExpiresAt: lease.UTC(), ExpiresAt: expires.UTC(), FencingToken: op.FencingToken}
		return nil
	})
	if err != nil {
		return nil, storeError("renew", err)
	}
	if lapsed {
		return nil, ErrLeaseExpired
	}
	return out, nil
}
