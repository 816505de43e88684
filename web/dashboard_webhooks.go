package web

import (
	"errors"
	"strconv"
	"strings"

	"github.com/gofiber/fiber/v2"
	"github.com/idemgate/idemgate/services"
	"github.com/idemgate/idemgate/views"
)

// Webhooks on the dashboard (docs/reference.md §10): the admin page's endpoint section and its
// forms (global admins), and the delivery log (every role, scoped to the account's tenant).

// webhookDeliveriesURL is the delivery log.
const webhookDeliveriesURL = "/webhooks"

// adminWebhooksURL is where the admin page's webhook forms post.
const adminWebhooksURL = adminURL + "/webhooks"

// adminWebhooksProps fills the admin page's webhook section: the endpoints, the tenants to
// choose from, the event types. Form values and a new secret already in p are kept.
func (s *Server) adminWebhooksProps(c *fiber.Ctx, acct *services.OperatorAccount, p *views.AdminWebhooksProps) error {
	if s.webhooks == nil {
		return nil
	}
	ctx := c.UserContext()
	eps, err := s.webhooks.AdminListEndpoints(ctx, acct)
	if err != nil {
		return err
	}
	if p.Tenants, err = s.webhooks.TenantNames(ctx); err != nil {
		return err
	}
	p.Enabled, p.CSRFToken, p.EventTypes, p.DeliveriesURL = true, csrfToken(c), services.WebhookEventTypes, webhookDeliveriesURL
	if p.Form.Events == nil {
		p.Form.Events = map[string]bool{}
	}
	p.Endpoints = make([]views.AdminWebhookRow, 0, len(eps))
	for _, e := range eps {
		base := adminWebhooksURL + "/" + strconv.FormatInt(e.ID, 10)
		r := views.AdminWebhookRow{ID: strconv.FormatInt(e.ID, 10), Tenant: e.Tenant, URL: e.URL,
			Events: strings.Join(e.Events, ", "), Status: e.Status, CreatedBy: e.CreatedBy, DeleteURL: base + "/delete",
			ToggleURL: base + "/disable", ToggleLabel: "Disable"}
		if e.Status == "disabled" {
			r.ToggleURL, r.ToggleLabel = base+"/enable", "Enable"
		}
		r.Created, r.CreatedISO = opPageTime(e.CreatedAt)
		p.Endpoints = append(p.Endpoints, r)
	}
	return nil
}

// handleAdminWebhookCreate is POST /admin/webhooks (form fields tenant, url, events — one per
// ticked box). It answers with the admin page itself, which shows the signing secret this
// once: the secret is never put in a URL or the session.
func handleAdminWebhookCreate(s *Server) fiber.Handler {
	return func(c *fiber.Ctx) error {
		form := views.AdminWebhookFormValues{Tenant: c.FormValue("tenant"), URL: strings.TrimSpace(c.FormValue("url")),
			Events: map[string]bool{}}
		var events []string
		for _, v := range c.Request().PostArgs().PeekMulti("events") {
			events = append(events, string(v))
			form.Events[string(v)] = true
		}
		ep, err := s.webhooks.AdminCreateEndpoint(c.UserContext(), currentOperator(c),
			services.WebhookEndpointInput{Tenant: form.Tenant, URL: form.URL, Events: strings.Join(events, ",")})
		if err != nil {
			return s.refuseAdmin(c, err, "Webhook endpoint not added: ", views.AdminProps{Webhooks: views.AdminWebhooksProps{Form: form}})
		}
		return s.renderAdmin(c, fiber.StatusOK, views.AdminProps{Flash: "Webhook endpoint added.",
			Webhooks: views.AdminWebhooksProps{NewSecret: ep.Secret, NewSecretURL: ep.Endpoint.URL}})
	}
}

// handleAdminWebhookDelete is POST /admin/webhooks/{id}/delete (confirm=yes required).
func handleAdminWebhookDelete(s *Server) fiber.Handler {
	return func(c *fiber.Ctx) error {
		if c.FormValue("confirm") != "yes" {
			return s.renderAdmin(c, fiber.StatusBadRequest, views.AdminProps{
				ActionError: "Not deleted: tick the confirmation box to delete the endpoint. Nothing was changed."})
		}
		id, _ := strconv.ParseInt(c.Params("id"), 10, 64)
		if err := s.webhooks.AdminDeleteEndpoint(c.UserContext(), currentOperator(c), id); err != nil {
			return s.refuseAdmin(c, err, "Not deleted: ", views.AdminProps{})
		}
		return c.Redirect(adminURL+"?done=webhook-deleted", fiber.StatusSeeOther)
	}
}

// handleAdminWebhookDisable is POST /admin/webhooks/{id}/disable (disabled true) or
// /enable (false).
func handleAdminWebhookDisable(s *Server, disabled bool) fiber.Handler {
	return func(c *fiber.Ctx) error {
		id, _ := strconv.ParseInt(c.Params("id"), 10, 64)
		if err := s.webhooks.AdminSetEndpointDisabled(c.UserContext(), currentOperator(c), id, disabled); err != nil {
			return s.refuseAdmin(c, err, "Not changed: ", views.AdminProps{})
		}
		done := "webhook-enabled"
		if disabled {
			done = "webhook-disabled"
		}
		return c.Redirect(adminURL+"?done="+done, fiber.StatusSeeOther)
	}
}

// handleWebhookDeliveriesPage is GET /webhooks: the newest deliveries the account may see.
func handleWebhookDeliveriesPage(s *Server) fiber.Handler {
	return func(c *fiber.Ctx) error {
		acct := currentOperator(c)
		if acct == nil {
			return redirectToLogin(c)
		}
		status := strings.TrimSpace(c.Query("status"))
		rows, err := s.webhooks.Deliveries(c.UserContext(), acct, status, 0)
		var de *services.Error
		if errors.As(err, &de) && de.Code == services.CodeInvalidRequest {
			return s.renderErrorPage(c, fiber.StatusBadRequest, "Status must be pending, delivered or failed.")
		} else if err != nil {
			return err
		}
		nav, err := s.navFor(c, acct, "webhooks")
		if err != nil {
			return err
		}
		p := views.WebhookDeliveriesProps{Nav: nav, Status: status, Statuses: services.DeliveryStatuses,
			Rows: make([]views.WebhookDeliveryRow, 0, len(rows))}
		for _, d := range rows {
			r := views.WebhookDeliveryRow{MsgID: d.MsgID, EventType: d.EventType, OperationID: d.OperationID,
				OperationURL: "/operations/" + d.OperationID, Tenant: d.Tenant, Endpoint: d.EndpointURL, Status: d.Status,
				Attempts: strconv.Itoa(d.Attempts), LastError: d.LastError}
			r.Occurred, _ = opPageTime(d.OccurredAt)
			if d.LastStatus != 0 {
				r.LastStatus = strconv.Itoa(d.LastStatus)
			}
			if d.NextAttemptAt != nil {
				r.NextAttempt, _ = opPageTime(*d.NextAttemptAt)
			}
			p.Rows = append(p.Rows, r)
		}
		return render(c, fiber.StatusOK, views.WebhookDeliveriesPage(p))
	}
}
