package services

import "slices"

// Who may do what on the dashboard. The HTTP layer asks these instead of comparing roles and
// states itself, so a rule changes in one place and every page and check follows. The
// services that act check the same rules again; these only decide what a page offers.

// roles are the roles an account can have, most powerful first.
var roles = []string{RoleAdmin, RoleOperator, RoleAuditor}

// Roles returns the roles an account can have, most powerful first (the order a form offers
// them in). The slice is the caller's.
func Roles() []string { return slices.Clone(roles) }

// MayAct reports whether acct may change operations (record confirmed outcomes, release keys):
// admins and operators may; auditors are read-only. A nil account may not.
func MayAct(acct *OperatorAccount) bool {
	return acct != nil && (acct.Role == RoleAdmin || acct.Role == RoleOperator)
}

// SeesAllTenants reports whether acct is a global account, one not restricted to a tenant: it
// sees every tenant's keys, operations and attempts, so pages name the tenant of each row and
// it may filter by tenant. A nil account is false.
func SeesAllTenants(acct *OperatorAccount) bool {
	return acct != nil && acct.TenantID == nil
}

// operatorActions reports which of the detail page's actions acct may take on o as read:
// record a confirmed outcome (o in_progress or uncertain, the states ReconcileOutcome changes)
// and release the key (o holds the key, live or expired but not yet cleared, in a state
// OperatorRelease releases). Both need MayAct.
func operatorActions(acct *OperatorAccount, o *OperatorOperation) (outcome, release bool) {
	if !MayAct(acct) {
		return false, false
	}
	outcome = reconcilable(o.State)
	release = o.HoldsKey && releasable(o.State) == nil
	return outcome, release
}
