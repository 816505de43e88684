package services

import (
	"slices"
	"time"

	"github.com/idemgate/idemgate/models"
	"gorm.io/gorm"
)

// The rules of the operation state machine (docs: states and guarantees), each decided here
// once for both stores and for every caller: the API, the dashboard and the reaper. The
// PostgreSQL function idemgate_acquire is the one other place that states the admission and
// expiry rules, in SQL, because PostgreSQL must take that decision under row locks in one
// round trip; TestAdmissionRulesAgree holds the two to the same answers.

// holdIsLive reports whether a key row's hold is live at now: it names a holder and has not
// expired. An expired hold that nobody cleared yet is not live: the next acquire takes the key
// over and the reaper clears it.
func holdIsLive(holder *string, expiresAt *time.Time, now time.Time) bool {
	return holder != nil && expiresAt != nil && expiresAt.After(now)
}

// answerOnLiveHold decides an acquire of a key that holder h holds live. The same operation
// name and fingerprint make a duplicate, any difference a conflict (422). An attempt_id retry
// is admitted again (readmitted, 201 with a fresh owner token) only when it is the creating
// API key's own retry and the operation is still in_progress: every key of a tenant can read
// attempt_ids from the attempt log, and once the operation has an outcome a 201 would tell the
// caller to run the effect twice.
func answerOnLiveHold(h *models.Operation, in AcquireInput, apiKeyID int64) (result string, readmitted bool) {
	switch {
	case !sameRequest(h, in):
		return ResultConflict, false
	case in.AttemptID != nil && h.AttemptID != nil && *h.AttemptID == *in.AttemptID &&
		h.APIKeyID != nil && *h.APIKeyID == apiKeyID && h.State == StateInProgress:
		return ResultAdmitted, true
	}
	return ResultDuplicate, false
}

// sameRequest reports whether in asks for what operation h was admitted for: the same
// operation name and the same fingerprint, absent on both counting as the same. An acquire of
// a key held for another request is a conflict (422 fingerprint_mismatch), whichever path
// answers it: a live hold (answerOnLiveHold) or a key held past its TTL until reconciled.
// PostgreSQL's acquire functions state it as idemgate_same_request
// (models/sql/postgres/idemgate_rules.sql).
func sameRequest(h *models.Operation, in AcquireInput) bool {
	return sameOptional(h.OperationName, in.Operation) && sameOptional(h.Fingerprint, in.Fingerprint)
}

// expiryReason is the reason an in_progress operation whose hold or lease ran out becomes
// uncertain with: lease_expired_without_outcome when its lease ended before its TTL (a lease
// shorter than the TTL, not renewed to it), ttl_expired_without_outcome otherwise. PostgreSQL's
// acquire functions state the same rule (models/sql/postgres/idemgate_acquire.sql).
func expiryReason(m *models.Operation) string {
	if m.LeaseEnd().Before(m.ExpiresAt) {
		return ReasonLeaseExpired
	}
	return ReasonTTLExpired
}

// expiryDetail is the event detail of an expiry to uncertain at the end of the TTL.
const expiryDetail = "in_progress -> uncertain: " + ReasonTTLExpired

// expireToUncertain applies the expiry rule to operation opID, whose hold ran out at or
// before now (the key row says so; its caller holds that row or the database's write lock):
// still in_progress, its outcome is unknown, so it becomes uncertain (reason expiryReason)
// with an event, in tx. It never leaves the reconciliation queue by itself. The state compare
// makes it a no-op for an operation that has an outcome; expired reports whether it changed
// the operation. Used by the reaper, renew and SQLite's acquire.
func expireToUncertain(tx *gorm.DB, tenantID int64, opID string, now time.Time) (expired bool, err error) {
	return expireIf(tx, tenantID, opID, now, false)
}

// expireLease is expireToUncertain for an operation whose lease, not its hold, ran out: the
// update also compares the lease, so a renew that committed since the caller read the
// operation (its lease live again) wins and nothing changes.
func expireLease(tx *gorm.DB, tenantID int64, opID string, now time.Time) (expired bool, err error) {
	return expireIf(tx, tenantID, opID, now, true)
}

func expireIf(tx *gorm.DB, tenantID int64, opID string, now time.Time, leaseOnly bool) (bool, error) {
	var m models.Operation
	if err := tx.Where("id = ?", opID).Take(&m).Error; err != nil {
		return false, err
	}
	if m.State != StateInProgress {
		return false, nil
	}
	reason := expiryReason(&m)
	q := tx.Model(&models.Operation{}).Where("id = ? AND state = ?", opID, StateInProgress)
	if leaseOnly {
		q = q.Where("(lease_expires_at IS NULL OR lease_expires_at <= ?)", now)
	}
	res := q.Updates(map[string]any{"state": StateUncertain, "state_reason": reason})
	if res.Error != nil || res.RowsAffected == 0 {
		return false, res.Error
	}
	return true, tx.Create(&models.Event{OperationID: opID, TenantID: tenantID, Kind: EventStateChanged,
		Actor: ActorSystem, Detail: "in_progress -> uncertain: " + reason, CreatedAt: now}).Error
}

// leaseLapsed reports whether in_progress operation m's lease ran out at now without an
// outcome: it is then presumed crashed and becomes uncertain, while its key stays protected
// until the TTL (docs/reference.md §8).
func leaseLapsed(m *models.Operation, now time.Time) bool {
	return m.State == StateInProgress && !m.LeaseEnd().After(now)
}

// lapseIfLeaseLapsed applies the lapse of docs/reference.md §8 to operation m in tx when m is
// in_progress and its lease ran out at now: expireLease, the compare on state and lease that
// acquire, renew and the reaper use, so an outcome or renew committed since m was read wins.
// It reports whether m became uncertain by this call. Release and the operator release call it
// so that their answer about a lapsed lease never depends on whether the reaper ran first.
func lapseIfLeaseLapsed(tx *gorm.DB, m *models.Operation, now time.Time) (bool, error) {
	if !leaseLapsed(m, now) {
		return false, nil
	}
	return expireLease(tx, m.TenantID, m.ID, now)
}

// holdsUntilReconciled reports whether operation m, the newest of its key, keeps the key from
// being admitted again after its TTL: its policy is hold_until_reconciled and it is not
// reconciled to failed (or released). An in_progress one is first made uncertain; an
// uncertain one answers 409 outcome_uncertain; a succeeded one answers duplicates with its
// outcome, past the TTL too (docs/reference.md §8).
func holdsUntilReconciled(m *models.Operation) bool {
	if m.OnExpiry != OnExpiryHold {
		return false
	}
	switch m.State {
	case StateInProgress, StateUncertain, StateSucceeded:
		return true
	}
	return false
}

// answersOutcomeUncertain reports whether a duplicate acquire answered about op is refused
// with 409 outcome_uncertain (with the operation) instead of 200: op is uncertain because its
// lease lapsed, or its policy is hold_until_reconciled. An operation its owner reported
// uncertain under the readmit policy is answered 200, as before leases.
func answersOutcomeUncertain(op *Operation) bool {
	return op.State == StateUncertain &&
		(op.OnExpiry == OnExpiryHold || (op.StateReason != nil && *op.StateReason == ReasonLeaseExpired))
}

// duplicateEffectStates are the states in which an operation's effect may have happened:
// succeeded (confirmed) or uncertain (unknown). Admitting its key again after such an
// operation may duplicate its effect: acquire tells the new attempt about it
// (previous_operation: check the destination first), the audit flags the admission as a
// possible duplicate effect, and the operation page names the earlier operation. It is judged
// by the earlier operation's state now: one later reconciled as failed flags nothing.
// SQL states it as idemgate_may_duplicate_effect on PostgreSQL and as a state list in
// SQLite's triggers; TestDuplicateEffectRule holds all of them to this one.
var duplicateEffectStates = []string{StateSucceeded, StateUncertain}

// mayDuplicateEffect reports whether state is one of duplicateEffectStates.
func mayDuplicateEffect(state string) bool { return slices.Contains(duplicateEffectStates, state) }

// warnedGeneration selects the generation an admission of the key keyID with fencing token
// next is warned about (previous_operation, docs/reference.md §4): the newest earlier one whose
// effect may have happened, in its state now. Not simply the one just below: after an uncertain
// generation, a later one released or failed did nothing, and naming it would drop the warning
// about the one still in doubt (issue 32). Served by the operations_effect index, one probe
// however many released generations the key has had. idemgate_acquire states the same in SQL.
func warnedGeneration(tx *gorm.DB, keyID, next int64) *gorm.DB {
	return tx.Model(&models.Operation{}).
		Where("key_id = ? AND fencing_token < ? AND state IN ?", keyID, next, duplicateEffectStates).
		Order("fencing_token DESC").Limit(1)
}

// releasable says whether an operation in state may give up its hold: only when no effect is
// confirmed or in doubt. Errors: ErrEffectConfirmed (succeeded), ErrOutcomeUncertain
// (uncertain: reconcile first), ErrInvalidTransition (released).
func releasable(state string) error {
	switch state {
	case StateInProgress, StateFailed:
		return nil
	case StateSucceeded:
		return ErrEffectConfirmed
	case StateUncertain:
		return ErrOutcomeUncertain
	}
	return ErrInvalidTransition
}

// reconcilable says whether an operator may record a confirmed outcome of an operation in
// state: while its outcome is not known, in_progress or uncertain.
func reconcilable(state string) bool {
	return state == StateInProgress || state == StateUncertain
}

// outcomeMove is what recording an outcome does to an operation.
type outcomeMove int

const (
	// moveNone: a repeat of the outcome already recorded; nothing changes and the call succeeds.
	moveNone outcomeMove = iota
	// moveRecord: write the outcome and move to its state (or to released, with release).
	moveRecord
	// moveReleaseFailed: a failed operation repeats its failed outcome with release; the
	// recorded outcome is kept and only the hold is released.
	moveReleaseFailed
)

// outcomeTransition decides recording outcome status on an operation in state: hasOutcome says
// whether one is recorded, same whether it equals the new one (status, receipt and response),
// release whether the caller also releases the hold. From in_progress every outcome is
// recorded; from uncertain, a confirmed one reconciles it, and the caller's "uncertain"
// details are recorded once; failed and the terminal states (succeeded, released) accept only a
// repeat of their outcome (failed with release then releases). Errors: ErrInvalidTransition.
func outcomeTransition(state string, hasOutcome, same bool, status string, release bool) (outcomeMove, error) {
	switch state {
	case StateInProgress:
		return moveRecord, nil
	case StateUncertain:
		if status == StateUncertain && hasOutcome {
			if same {
				return moveNone, nil
			}
			return moveNone, ErrInvalidTransition
		}
		return moveRecord, nil
	case StateFailed:
		switch {
		case !same:
			return moveNone, ErrInvalidTransition
		case release:
			return moveReleaseFailed, nil
		}
		return moveNone, nil
	}
	if same {
		return moveNone, nil
	}
	return moveNone, ErrInvalidTransition
}

func sameOptional(a, b *string) bool {
	if a == nil || b == nil {
		return a == nil && b == nil
	}
	return *a == *b
}

// Readings of an operation's or key's state that the dashboard shows. The HTTP layer asks
// these instead of interpreting states and attempt results itself.

// NeedsReconciliation reports whether an operation in state waits for an operator's confirmed
// outcome: an uncertain one. The reconciliation queue (ReconciliationQueue) lists exactly
// these, superseded ones included, and Overview.NeedsReconciliation counts them.
func NeedsReconciliation(state string) bool { return state == StateUncertain }

// HoldStatus is how a key's hold stands at one instant (KeyView.HoldAt).
type HoldStatus int

const (
	// HoldNone: nobody holds the key: its newest operation was released, or retention purged
	// it.
	HoldNone HoldStatus = iota
	// HoldLive: the hold has time left.
	HoldLive
	// HoldExpired: the hold ran out and no acquire or reaper pass has cleared it yet.
	HoldExpired
)

// HoldAt judges v's hold at now, which should be the database time v was read at (the clock
// that decides expiry), and returns the time left for a live hold (0 otherwise).
func (v KeyView) HoldAt(now time.Time) (HoldStatus, time.Duration) {
	switch {
	case v.Held && v.ExpiresAt != nil && v.ExpiresAt.After(now):
		return HoldLive, v.ExpiresAt.Sub(now)
	case v.Operation != nil && v.Operation.State != StateReleased:
		// The hold ran out; a released operation simply has none.
		return HoldExpired, 0
	}
	return HoldNone, 0
}

// AdmittedAttemptID returns the attempt_id of the attempt that admitted d (the first admitted
// attempt in d.Attempts that carries a non-empty one), or "" when its caller sent none or
// retention purged the attempt.
func (d *OperationDetail) AdmittedAttemptID() string {
	for _, a := range d.Attempts {
		if a.Result == ResultAdmitted && a.AttemptID != nil && *a.AttemptID != "" {
			return *a.AttemptID
		}
	}
	return ""
}
