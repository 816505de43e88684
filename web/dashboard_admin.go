package web

import (
	"errors"
	"strconv"
	"strings"

	"github.com/gofiber/fiber/v2"
	"github.com/idemgate/idemgate/services"
	"github.com/idemgate/idemgate/views"
)

// adminURL is the admin page.
const adminURL = "/admin"

// adminFlashes are the only messages a ?done= parameter can show.
var adminFlashes = map[string]string{
	"revoked":          "API key revoked. Every instance refuses it within a second.",
	"operator-created": "Operator account created.",
	"role":             "Role saved. It applies at the account's next request.",
	"deleted":          "Operator account deleted. Its sessions end at their next request.",
	"webhook-deleted":  "Webhook endpoint deleted. Its pending deliveries end as failed.",
	"policy-set":       "Policy set. New admissions take it within 5 seconds; admitted operations keep theirs.",
	"policy-deleted":   "Policy deleted. New admissions take the tenant-wide policy or the defaults within 5 seconds.",
	"webhook-disabled": "Webhook endpoint disabled. It gets no new events; pending deliveries wait.",
	"webhook-enabled":  "Webhook endpoint enabled. Pending deliveries resume.",
}

// adminRoles are the roles the page offers, most powerful first.
var adminRoles = services.Roles()

// requireAdmin lets only global admins through: a tenant's admin manages nothing
// installation-wide (see services.IsGlobalAdmin).
func (s *Server) requireAdmin(c *fiber.Ctx) error {
	if !services.IsGlobalAdmin(currentOperator(c)) {
		return s.renderErrorPage(c, fiber.StatusForbidden,
			"Only a global admin account may manage API keys and operator accounts. Nothing was done.")
	}
	return c.Next()
}

// handleAdminPage is GET /admin.
func handleAdminPage(s *Server) fiber.Handler {
	return func(c *fiber.Ctx) error {
		return s.renderAdmin(c, fiber.StatusOK, views.AdminProps{Flash: adminFlashes[c.Query("done")]})
	}
}

// handleAdminKeyCreate is POST /admin/api-keys. It answers with the page itself (200), which
// shows the new secret this once: the secret is never put in a URL or the session.
func handleAdminKeyCreate(s *Server) fiber.Handler {
	return func(c *fiber.Ctx) error {
		// The tenant comes from the select of existing tenants, or the "new tenant" field when
		// it is filled in.
		form := views.AdminKeyFormValues{Tenant: strings.TrimSpace(c.FormValue("tenant")),
			NewTenant: strings.TrimSpace(c.FormValue("new_tenant")), Label: c.FormValue("label")}
		tenant := form.Tenant
		if form.NewTenant != "" {
			tenant = form.NewTenant
		}
		if tenant == "" {
			return s.renderAdmin(c, fiber.StatusBadRequest, views.AdminProps{KeyForm: form,
				ActionError: "API key not created: choose a tenant from the list or type a new tenant's name. Nothing was changed."})
		}
		secret, err := s.accounts.CreateAPIKey(c.UserContext(), currentOperator(c), tenant, form.Label, "")
		if err != nil {
			return s.refuseAdmin(c, err, "API key not created: ", views.AdminProps{KeyForm: form})
		}
		return s.renderAdmin(c, fiber.StatusOK, views.AdminProps{NewSecret: secret, NewSecretTenant: tenant,
			Flash: "API key created."})
	}
}

// handleAdminKeyRevoke is POST /admin/api-keys/{id}/revoke.
func handleAdminKeyRevoke(s *Server) fiber.Handler {
	return func(c *fiber.Ctx) error {
		if c.FormValue("confirm") != "yes" {
			return s.renderAdmin(c, fiber.StatusBadRequest, views.AdminProps{
				ActionError: "Not revoked: tick the confirmation box to revoke the key. Nothing was changed."})
		}
		id, _ := strconv.ParseInt(c.Params("id"), 10, 64)
		if _, err := s.accounts.RevokeAPIKey(c.UserContext(), currentOperator(c), services.APIKeyRef{ID: id}); err != nil {
			return s.refuseAdmin(c, err, "Not revoked: ", views.AdminProps{})
		}
		return c.Redirect(adminURL+"?done=revoked", fiber.StatusSeeOther)
	}
}

// handleAdminOperatorCreate is POST /admin/operators.
func handleAdminOperatorCreate(s *Server) fiber.Handler {
	return func(c *fiber.Ctx) error {
		form := views.AdminOperatorFormValues{Username: strings.TrimSpace(c.FormValue("username")),
			Role: c.FormValue("role"), Tenant: strings.TrimSpace(c.FormValue("tenant"))}
		_, err := s.accounts.CreateOperator(c.UserContext(), currentOperator(c), form.Username, c.FormValue("password"),
			form.Role, form.Tenant)
		if err != nil {
			return s.refuseAdmin(c, err, "Account not created: ", views.AdminProps{OperatorForm: form})
		}
		return c.Redirect(adminURL+"?done=operator-created", fiber.StatusSeeOther)
	}
}

// handleAdminOperatorRole is POST /admin/operators/{id}/role.
func handleAdminOperatorRole(s *Server) fiber.Handler {
	return func(c *fiber.Ctx) error {
		id, _ := strconv.ParseInt(c.Params("id"), 10, 64)
		if err := s.accounts.SetOperatorRole(c.UserContext(), currentOperator(c), id, c.FormValue("role")); err != nil {
			return s.refuseAdmin(c, err, "Role not changed: ", views.AdminProps{})
		}
		return c.Redirect(adminURL+"?done=role", fiber.StatusSeeOther)
	}
}

// handleAdminOperatorDelete is POST /admin/operators/{id}/delete.
func handleAdminOperatorDelete(s *Server) fiber.Handler {
	return func(c *fiber.Ctx) error {
		if c.FormValue("confirm") != "yes" {
			return s.renderAdmin(c, fiber.StatusBadRequest, views.AdminProps{
				ActionError: "Not deleted: tick the confirmation box to delete the account. Nothing was changed."})
		}
		id, _ := strconv.ParseInt(c.Params("id"), 10, 64)
		if err := s.accounts.DeleteOperator(c.UserContext(), currentOperator(c), id); err != nil {
			return s.refuseAdmin(c, err, "Not deleted: ", views.AdminProps{})
		}
		return c.Redirect(adminURL+"?done=deleted", fiber.StatusSeeOther)
	}
}

// adminFormLabels name the form fields as the page labels them.
var adminFormLabels = map[string]string{
	"tenant": "Tenant", "label": "Label", "username": "Username", "role": "Role", "password": "Password",
	"url": "URL", "events": "Events",
}

// refuseAdmin answers a refused admin action: the page again with the reason (400 for invalid
// input, 404 for an unknown or already revoked object), 403 for a non-admin, or the error
// handler for anything unexpected.
func (s *Server) refuseAdmin(c *fiber.Ctx, err error, prefix string, p views.AdminProps) error {
	var de *services.Error
	if !errors.As(err, &de) {
		return err
	}
	status := fiber.StatusBadRequest
	switch de.Code {
	case services.CodeUnauthorized:
		return s.renderErrorPage(c, fiber.StatusForbidden, de.Message)
	case services.CodeNotFound:
		status, p.ActionError = fiber.StatusNotFound, prefix+"there is no such object any more (or it was already revoked). Nothing was changed."
	case services.CodeInvalidRequest:
		p.ActionError = prefix + fieldProblems(de, adminFormLabels) + " Nothing was changed."
	default:
		return err
	}
	return s.renderAdmin(c, status, p)
}

// renderAdmin renders the admin page with the current keys and accounts and p's flash,
// refusal, secret and typed values.
func (s *Server) renderAdmin(c *fiber.Ctx, status int, p views.AdminProps) error {
	acct := currentOperator(c)
	if acct == nil {
		return redirectToLogin(c)
	}
	ctx := c.UserContext()
	keys, err := s.accounts.ListAPIKeys(ctx, acct)
	if err != nil {
		return err
	}
	ops, err := s.accounts.ListOperators(ctx, acct)
	if err != nil {
		return err
	}
	if p.Nav, err = s.navFor(c, acct, "admin"); err != nil {
		return err
	}
	p.Roles = adminRoles
	if err := s.adminWebhooksProps(c, acct, &p.Webhooks); err != nil {
		return err
	}
	tenants, err := s.dash.Tenants(ctx)
	if err != nil {
		return err
	}
	for _, t := range tenants {
		p.Tenants = append(p.Tenants, t.Name)
	}
	if err := s.adminPoliciesProps(c, acct, p.Tenants, &p.Policies); err != nil {
		return err
	}
	if p.OperatorForm.Role == "" {
		p.OperatorForm.Role = services.RoleOperator
	}
	p.APIKeys = make([]views.AdminAPIKeyRow, 0, len(keys))
	for _, k := range keys {
		r := views.AdminAPIKeyRow{Prefix: k.Prefix, Tenant: k.Tenant, Label: k.Label}
		r.Created, r.CreatedISO = opPageTime(k.CreatedAt)
		if k.LastUsedAt != nil {
			r.LastUsed, r.LastUsedISO = opPageTime(*k.LastUsedAt)
		}
		if k.RevokedAt != nil {
			r.Revoked, _ = opPageTime(*k.RevokedAt)
		} else {
			r.RevokeURL = adminURL + "/api-keys/" + strconv.FormatInt(k.ID, 10) + "/revoke"
		}
		p.APIKeys = append(p.APIKeys, r)
	}
	p.Operators = make([]views.AdminOperatorRow, 0, len(ops))
	for _, o := range ops {
		base := adminURL + "/operators/" + strconv.FormatInt(o.ID, 10)
		r := views.AdminOperatorRow{Username: o.Username, Role: o.Role, Tenant: o.Tenant, RoleURL: base + "/role",
			DeleteURL: base + "/delete", Self: o.ID == acct.ID}
		r.Created, _ = opPageTime(o.CreatedAt)
		p.Operators = append(p.Operators, r)
	}
	return render(c, status, views.AdminPage(p))
}
