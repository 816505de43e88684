package web

import (
	"strings"
	"time"

	"github.com/gofiber/fiber/v2"
	"github.com/idemgate/idemgate/services"
	"github.com/idemgate/idemgate/views"
)

// Policies on the admin page (docs/reference.md §2 "Policies"): the list and the set and
// delete forms, for global admins (services.Policies refuses anyone else).

// adminPoliciesURL is where the admin page's policy forms post.
const adminPoliciesURL = adminURL + "/policies"

// adminPoliciesProps fills the admin page's policy section for acct: left out unless acct is a
// global admin. Form values already in p are kept.
func (s *Server) adminPoliciesProps(c *fiber.Ctx, acct *services.OperatorAccount, tenants []string, p *views.AdminPoliciesProps) error {
	if !services.IsGlobalAdmin(acct) {
		return nil
	}
	list, err := s.policies.List(c.UserContext(), "")
	if err != nil {
		return err
	}
	p.Enabled, p.CSRFToken, p.Tenants = true, csrfToken(c), tenants
	p.Rows = make([]views.AdminPolicyRow, 0, len(list))
	for _, pol := range list {
		r := views.AdminPolicyRow{Tenant: pol.Tenant, Operation: pol.Operation, OperationName: pol.Operation,
			TTL: durationText(pol.TTL), Lease: durationText(pol.Lease), OnExpiry: "—", Retention: durationText(pol.Retention),
			Horizon: durationText(pol.Horizon), UpdatedBy: pol.UpdatedBy}
		if r.Operation == "" {
			r.Operation = "every operation"
		}
		if pol.OnExpiry != nil {
			r.OnExpiry = *pol.OnExpiry
		}
		r.Updated, r.UpdatedISO = opPageTime(pol.UpdatedAt)
		p.Rows = append(p.Rows, r)
	}
	return nil
}

// durationText is d as the command line prints it ("90d", "1h30m"), "—" when not set.
func durationText(d *time.Duration) string {
	if d == nil {
		return "—"
	}
	return services.FormatDuration(*d)
}

// handleAdminPolicySet is POST /admin/policies (fields tenant, operation, ttl, lease,
// on_expiry, retention, horizon; an empty one is not set). A refused form is shown again with
// what was typed and the fields named.
func handleAdminPolicySet(s *Server) fiber.Handler {
	return func(c *fiber.Ctx) error {
		form := views.AdminPolicyFormValues{Tenant: c.FormValue("tenant"), Operation: strings.TrimSpace(c.FormValue("operation")),
			TTL: strings.TrimSpace(c.FormValue("ttl")), Lease: strings.TrimSpace(c.FormValue("lease")),
			OnExpiry: c.FormValue("on_expiry"), Retention: strings.TrimSpace(c.FormValue("retention")),
			Horizon: strings.TrimSpace(c.FormValue("horizon"))}
		in := services.PolicyInput{Tenant: form.Tenant, Operation: form.Operation}
		var bad []services.FieldError
		for _, f := range []struct {
			name, text string
			into       **time.Duration
		}{{"ttl", form.TTL, &in.TTL}, {"lease", form.Lease, &in.Lease}, {"retention", form.Retention, &in.Retention},
			{"horizon", form.Horizon, &in.Horizon}} {
			if f.text == "" {
				continue
			}
			d, err := services.ParseDuration(f.text)
			if err != nil {
				bad = append(bad, services.FieldError{Field: f.name, Message: "is not a duration such as 90d, 1h or 30s"})
				continue
			}
			*f.into = &d
		}
		if form.OnExpiry != "" {
			in.OnExpiry = &form.OnExpiry
		}
		refused := views.AdminProps{Policies: views.AdminPoliciesProps{Form: form}}
		if len(bad) > 0 {
			return s.refuseAdmin(c, &services.Error{Code: services.CodeInvalidRequest, Message: "The request has invalid fields.",
				Fields: bad}, "Policy not set: ", refused)
		}
		if _, err := s.policies.Set(c.UserContext(), currentOperator(c), in); err != nil {
			return s.refuseAdmin(c, err, "Policy not set: ", refused)
		}
		return c.Redirect(adminURL+"?done=policy-set", fiber.StatusSeeOther)
	}
}

// handleAdminPolicyDelete is POST /admin/policies/delete (fields tenant, operation; confirm=yes
// required).
func handleAdminPolicyDelete(s *Server) fiber.Handler {
	return func(c *fiber.Ctx) error {
		if c.FormValue("confirm") != "yes" {
			return s.renderAdmin(c, fiber.StatusBadRequest, views.AdminProps{
				ActionError: "Not deleted: tick the confirmation box to delete the policy. Nothing was changed."})
		}
		if err := s.policies.Delete(c.UserContext(), currentOperator(c), c.FormValue("tenant"), c.FormValue("operation")); err != nil {
			return s.refuseAdmin(c, err, "Not deleted: ", views.AdminProps{})
		}
		return c.Redirect(adminURL+"?done=policy-deleted", fiber.StatusSeeOther)
	}
}
