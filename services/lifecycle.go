package services

import (
	"crypto/md5"
	"encoding/binary"
	"time"

	"github.com/idemgate/idemgate/models"
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

// tombstoneOperation is the operation object a tombstone answers with: what the key row kept
// of its purged last operation (docs/reference.md §2 "Lifecycle").
func tombstoneOperation(k *models.IdemKey) Operation {
	state := StateSucceeded
	if k.TombState != nil {
		state = *k.TombState
	}
	until := k.ProtectedUntil.UTC()
	op := Operation{ID: k.LastOperationID, Key: k.Key, State: state, FencingToken: k.FencingToken,
		AcquiredAt: k.AcquiredAt.UTC(), ExpiresAt: until, LeaseExpiresAt: until, OnExpiry: OnExpiryReadmit,
		ProtectedUntil: &until, EvidencePurged: true}
	if k.TombOutcomeStatus != nil {
		op.Outcome = &Outcome{Status: *k.TombOutcomeStatus, Receipt: k.TombOutcomeReceipt}
	}
	return op
}
