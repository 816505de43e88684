package services

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestDashboardRules pins the predicates the dashboard asks instead of reading roles and
// states itself (permissions.go, rules.go).
func TestDashboardRules(t *testing.T) {
	t.Parallel()
	tenant := int64(3)
	admin := &OperatorAccount{Role: RoleAdmin}
	tenantOperator := &OperatorAccount{Role: RoleOperator, TenantID: &tenant}
	auditor := &OperatorAccount{Role: RoleAuditor}

	require.Equal(t, []string{RoleAdmin, RoleOperator, RoleAuditor}, Roles())
	r := Roles()
	r[0] = "changed"
	require.Equal(t, RoleAdmin, Roles()[0], "each caller gets its own slice")

	require.True(t, MayAct(admin))
	require.True(t, MayAct(tenantOperator))
	require.False(t, MayAct(auditor))
	require.False(t, MayAct(nil))

	require.True(t, SeesAllTenants(admin))
	require.True(t, SeesAllTenants(auditor))
	require.False(t, SeesAllTenants(tenantOperator))
	require.False(t, SeesAllTenants(nil))

	for _, c := range []struct {
		acct             *OperatorAccount
		state            string
		holdsKey         bool
		outcome, release bool
	}{
		{admin, StateInProgress, true, true, true},
		{admin, StateInProgress, false, true, false},
		{tenantOperator, StateUncertain, true, true, false},
		{tenantOperator, StateFailed, true, false, true},
		{tenantOperator, StateFailed, false, false, false},
		{admin, StateSucceeded, true, false, false},
		{admin, StateReleased, false, false, false},
		{auditor, StateInProgress, true, false, false},
		{nil, StateInProgress, true, false, false},
	} {
		o := &OperatorOperation{HoldsKey: c.holdsKey}
		o.State = c.state
		outcome, release := operatorActions(c.acct, o)
		require.Equal(t, c.outcome, outcome, "outcome: %+v", c)
		require.Equal(t, c.release, release, "release: %+v", c)
	}

	require.True(t, NeedsReconciliation(StateUncertain))
	for _, s := range []string{StateInProgress, StateSucceeded, StateFailed, StateReleased, ""} {
		require.False(t, NeedsReconciliation(s), s)
	}

	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	later, earlier := now.Add(90*time.Second), now.Add(-time.Second)
	for _, c := range []struct {
		name string
		v    KeyView
		want HoldStatus
		left time.Duration
	}{
		{"live", KeyView{Held: true, ExpiresAt: &later, Operation: &Operation{State: StateInProgress}}, HoldLive, 90 * time.Second},
		{"ran out", KeyView{Held: true, ExpiresAt: &earlier, Operation: &Operation{State: StateInProgress}}, HoldExpired, 0},
		{"expires now", KeyView{Held: true, ExpiresAt: &now, Operation: &Operation{State: StateSucceeded}}, HoldExpired, 0},
		{"released", KeyView{Operation: &Operation{State: StateReleased}}, HoldNone, 0},
		{"purged", KeyView{}, HoldNone, 0},
	} {
		got, left := c.v.HoldAt(now)
		require.Equal(t, c.want, got, c.name)
		require.Equal(t, c.left, left, c.name)
	}

	id1, id2, empty := "first", "second", ""
	d := &OperationDetail{Attempts: []Attempt{
		{Result: ResultDuplicate, AttemptID: &id2},
		{Result: ResultAdmitted, AttemptID: &empty},
		{Result: ResultAdmitted, AttemptID: &id1},
		{Result: ResultAdmitted, AttemptID: &id2},
	}}
	require.Equal(t, "first", d.AdmittedAttemptID())
	require.Equal(t, "", (&OperationDetail{Attempts: []Attempt{{Result: ResultAdmitted}}}).AdmittedAttemptID())
}
