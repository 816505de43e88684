package services

import "time"

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
