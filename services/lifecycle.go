package services

import (
	"crypto/md5"
	"encoding/binary"
	"time"

	"github.com/idemgate/idemgate/models"
	"gorm.io/gorm"
)

// The lifecycle of docs/reference.md §2 "Lifecycle": an operation's evidence is kept for its
// retention after it ended (purge_after), and a succeeded operation with a horizon keeps its
// key from a new admission until the horizon ends after it ended (the key row's
// protected_until), through a tombstone once its evidence is purged. PostgreSQL states the
// same rules in models/sql/postgres/idemgate_rules.sql (idemgate_protected_until,
// idemgate_request_hash); TestLifecycleRulesAgree holds the two together.

// protectedUntil is when a key stops refusing new admissions because of operation m's horizon:
// its end plus HorizonSeconds for a succeeded operation with a horizon; nil otherwise (a failed
// or released operation never keeps its key past the TTL: nothing happened, or its owner gave
// the key back).
func protectedUntil(m *models.Operation) *time.Time {
	if m.State != StateSucceeded || m.HorizonSeconds == nil || m.EndedAt == nil {
		return nil
	}
	t := m.EndedAt.Add(time.Duration(*m.HorizonSeconds) * time.Second).UTC()
	return &t
}

// protectKey records, in tx, that operation m's success (at now) keeps its key from new
// admissions until its horizon ends: protected_until and protected_by on the key row, unless
// the key is already protected for longer. Whether m is still the key's newest operation does
// not matter: an operation that succeeded after the key was taken over from it (a late
// outcome, or a reconciliation of an uncertain one) has had its effect, and a next admission
// within its horizon would run it twice. A tombstone the key kept of another operation goes
// when the protection changes hands. Callers lock the key row before the operation
// (lockKeyForHorizon).
func protectKey(tx *gorm.DB, m *models.Operation, now time.Time) error {
	until := now.Add(time.Duration(*m.HorizonSeconds) * time.Second)
	return tx.Model(&models.IdemKey{}).
		Where("id = ? AND (protected_until IS NULL OR protected_until <= ?)", m.KeyID, until).
		Updates(map[string]any{"protected_until": until, "protected_by": m.ID, "tomb_fencing_token": nil,
			"tomb_state": nil, "tomb_outcome_status": nil, "tomb_outcome_receipt": nil, "tomb_request_hash": nil}).Error
}

// lockKeyForHorizon locks, in tx, the key row of operation m (read, not yet locked) when
// recording status on it may protect the key (a success with a horizon: protectKey), so the
// key row is taken before the operation, in the order acquire, release and the reaper take
// them: an outcome that took the operation and then the key deadlocked with a takeover of the
// same key (2 outcomes in 770 answered 503, issue 30's review).
func lockKeyForHorizon(tx *gorm.DB, st store, m *models.Operation, status string) error {
	if status != StateSucceeded || m.HorizonSeconds == nil {
		return nil
	}
	return st.lock(tx.Select("id")).Where("id = ?", m.KeyID).Take(&models.IdemKey{}).Error
}

// endUpdates are the columns an operation ending at now sets besides its state: ended_at,
// and purge_after when it was admitted with a retention (without one, the reaper purges it by
// ended_at and IDEMGATE_RETENTION, as before lifecycles).
func endUpdates(m *models.Operation, now time.Time, updates map[string]any) {
	updates["ended_at"] = now
	if m.RetentionSeconds != nil {
		updates["purge_after"] = now.Add(time.Duration(*m.RetentionSeconds) * time.Second)
	}
}

// requestHash is the 64-bit request hash a tombstone keeps (idem_keys.tomb_request_hash): the
// first 8 bytes of the MD5 of the operation name, a newline and the fingerprint, absent ones
// as empty. It equals PostgreSQL's idemgate_request_hash; see there for why MD5.
func requestHash(operation, fingerprint *string) int64 {
	sum := md5.Sum([]byte(deref(operation) + "\n" + deref(fingerprint)))
	return int64(binary.BigEndian.Uint64(sum[:8]))
}

// tombstoned reports whether key row k answers from a tombstone at now: protected, and the
// tombstone of its protecting operation written (the operation purged).
func tombstoned(k *models.IdemKey, now time.Time) bool {
	return protected(k, now) && k.ProtectedBy != nil && k.TombState != nil
}

// tombstoneOperation is the operation object a tombstone answers with: what the key row kept
// of its purged protecting operation (docs/reference.md §2 "Lifecycle").
func tombstoneOperation(k *models.IdemKey) Operation {
	state := StateSucceeded
	if k.TombState != nil {
		state = *k.TombState
	}
	fencing := k.FencingToken
	if k.TombFencingToken != nil {
		fencing = *k.TombFencingToken
	}
	until := k.ProtectedUntil.UTC()
	op := Operation{ID: *k.ProtectedBy, Key: k.Key, State: state, FencingToken: fencing,
		AcquiredAt: k.AcquiredAt.UTC(), ExpiresAt: until, LeaseExpiresAt: until, OnExpiry: OnExpiryReadmit,
		ProtectedUntil: &until, EvidencePurged: true}
	if k.TombOutcomeStatus != nil {
		op.Outcome = &Outcome{Status: *k.TombOutcomeStatus, Receipt: k.TombOutcomeReceipt}
	}
	return op
}
