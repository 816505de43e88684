package web

import (
	"errors"
	"net/url"
	"strconv"

	"github.com/gofiber/fiber/v2"
	"github.com/google/uuid"
	"github.com/idemgate/idemgate/services"
	"github.com/idemgate/idemgate/views"
)

// jobURL is the dashboard page of bulk job id.
func jobURL(id string) string { return queueURL + "/jobs/" + url.PathEscape(id) }

// bulkFormLabels name the bulk form's fields as the page labels them.
var bulkFormLabels = map[string]string{
	"job_id": "The form", "status": "Confirmed outcome", "note": "Note", "operation_ids": "Selection",
	"filter": "Selection", "filter.reason": "Reason",
}

// requireBulkActor refuses the bulk form to read-only accounts (auditors) with 403.
func (s *Server) requireBulkActor(c *fiber.Ctx) error {
	if services.MayAct(currentOperator(c)) {
		return c.Next()
	}
	return s.renderErrorPage(c, fiber.StatusForbidden, "Your account is read-only: it may view the queue but not reconcile. Nothing was done.")
}

// bulkForm is the queue page's bulk form for acct under filter q, with a fresh job token:
// each rendering is a new job, and submitting that rendering twice is the same job.
func bulkForm(c *fiber.Ctx, acct *services.OperatorAccount, q queueQuery) *views.BulkForm {
	if !services.MayAct(acct) {
		return nil
	}
	return &views.BulkForm{ActionURL: queueURL + "/jobs", CSRFToken: csrfToken(c), JobToken: "form-" + uuid.NewString(),
		Tenant: q.Tenant, Reason: q.Reason, Before: q.Before}
}

// handleBulkReconcile is POST /reconciliation/jobs (form fields job_id, scope = selected or
// filter, operation_ids, tenant, reason, before, status, note): one bulk job, then 303 to its
// page. A refused form answers the queue's problem on an error page (400), naming the field.
func handleBulkReconcile(s *Server) fiber.Handler {
	return func(c *fiber.Ctx) error {
		acct := currentOperator(c)
		in := services.BulkReconcileInput{JobID: c.FormValue("job_id"), Status: c.FormValue("status"), Note: c.FormValue("note")}
		if c.FormValue("scope") == "filter" {
			v := url.Values{"tenant": {c.FormValue("tenant")}, "reason": {c.FormValue("reason")}, "before": {c.FormValue("before")}}
			q, problem := parseQueueQuery(v)
			if problem != "" {
				return s.renderErrorPage(c, fiber.StatusBadRequest, "Not reconciled: "+problem+" Nothing was changed.")
			}
			before, _ := q.before()
			tenant, err := s.tenantID(c.UserContext(), q)
			if err != nil {
				return err
			}
			in.Filter = &services.BulkFilter{TenantID: tenant, Reason: q.Reason, UncertainBefore: before}
		} else {
			args := c.Request().PostArgs().PeekMulti("operation_ids")
			for _, a := range args {
				in.OperationIDs = append(in.OperationIDs, string(a))
			}
		}
		job, err := s.recon.BulkReconcileForOperator(c.UserContext(), acct, in)
		var de *services.Error
		switch {
		case err == nil:
			return c.Redirect(jobURL(job.ID), fiber.StatusSeeOther)
		case errors.As(err, &de) && de.Code == services.CodeInvalidRequest:
			msg := fieldProblems(de, bulkFormLabels)
			if len(in.OperationIDs) == 0 && in.Filter == nil {
				msg = "select at least one operation, or choose every operation matching the filter."
			}
			return s.renderErrorPage(c, fiber.StatusBadRequest, "Not reconciled: "+msg+" Nothing was changed.")
		case errors.As(err, &de) && de.Code == services.CodeJobIDReused:
			return s.renderErrorPage(c, fiber.StatusConflict, "Not reconciled: this form was already submitted with other choices. Reload the queue and try again. Nothing was changed.")
		case errors.As(err, &de) && de.Code == services.CodeUnauthorized:
			return s.renderErrorPage(c, fiber.StatusForbidden, de.Message)
		}
		return err
	}
}

// handleJobPage is GET /reconciliation/jobs/{id}: a bulk job's result, each operation done or
// skipped (and why).
func handleJobPage(s *Server) fiber.Handler {
	return func(c *fiber.Ctx) error {
		acct := currentOperator(c)
		if acct == nil {
			return redirectToLogin(c)
		}
		job, err := s.dash.JobForOperator(c.UserContext(), acct, c.Params("id"))
		if errors.Is(err, services.ErrNotFound) {
			return s.renderErrorPage(c, fiber.StatusNotFound, "There is no such reconciliation job, or your account may not see it.")
		} else if err != nil {
			return err
		}
		nav, err := s.navFor(c, acct, "reconciliation")
		if err != nil {
			return err
		}
		p := views.JobProps{Nav: nav, JobID: job.JobID, ShowTenant: services.SeesAllTenants(acct), Actor: job.Actor, Status: job.Status, Outcome: job.Outcome, Note: job.Note,
			Total: strconv.Itoa(job.Total), Done: strconv.Itoa(job.Done), Skipped: strconv.Itoa(job.Skipped),
			Limited: job.Limited, QueueURL: queueURL, Selection: "Selected operations"}
		if job.Selection == services.SelectionFilter {
			p.Selection = "Every operation matching the filter"
		}
		p.CreatedAt, p.CreatedISO = opPageTime(job.CreatedAt)
		ids := make([]string, 0, len(job.Items))
		for _, it := range job.Items {
			ids = append(ids, it.OperationID)
		}
		named, err := s.dash.JobOperations(c.UserContext(), acct, ids)
		if err != nil {
			return err
		}
		for _, it := range job.Items {
			n := named[it.OperationID]
			p.Items = append(p.Items, views.JobItemRow{OperationID: it.OperationID, URL: operationURL(it.OperationID),
				Key: n.Key, Tenant: n.Tenant, Result: it.Result, Detail: it.Detail})
		}
		return render(c, fiber.StatusOK, views.JobPage(p))
	}
}
