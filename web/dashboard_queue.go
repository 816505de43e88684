package web

import (
	"errors"
	"net/url"
	"strconv"
	"time"

	"github.com/gofiber/fiber/v2"
	"github.com/idemgate/idemgate/services"
	"github.com/idemgate/idemgate/views"
)

// queueURL is the dashboard's reconciliation queue; queuePageSize its page size.
const (
	queueURL      = "/reconciliation"
	queuePageSize = 100
)

// handleQueuePage is GET /reconciliation?cursor=: every operation in state uncertain that the
// account may see, superseded or not, oldest first by the time it became uncertain — the same
// rows the Overview counts as needing reconciliation.
func handleQueuePage(s *Server) fiber.Handler {
	return func(c *fiber.Ctx) error {
		op := currentOperator(c)
		if op == nil {
			return redirectToLogin(c)
		}
		cursor := c.Query("cursor")
		page, err := s.dash.ReconciliationQueue(c.UserContext(), op.TenantID,
			services.OperationFilter{Limit: queuePageSize, Cursor: cursor})
		var de *services.Error
		if errors.As(err, &de) && de.Code == services.CodeInvalidRequest {
			return s.renderErrorPage(c, fiber.StatusBadRequest, "This page link is not valid any more. Start again from the first page.")
		} else if err != nil {
			return err
		}
		nav, err := s.navFor(c, op, "reconciliation")
		if err != nil {
			return err
		}
		p := views.QueueProps{Nav: nav, ShowTenant: services.SeesAllTenants(op), Rows: make([]views.QueueRow, 0, len(page.Items))}
		if cursor != "" {
			p.FirstURL = queueURL
		}
		if page.NextCursor != "" {
			p.NextURL = queueURL + "?cursor=" + url.QueryEscape(page.NextCursor)
		}
		for i := range page.Items {
			q := &page.Items[i]
			r := views.QueueRow{OperationID: q.ID, URL: operationURL(q.ID), Key: q.Key, Tenant: q.TenantName,
				Operation: opText(q.Operation.Operation), FencingToken: strconv.FormatInt(q.FencingToken, 10),
				Reason: opText(q.StateReason), Superseded: q.Superseded}
			if r.Tenant == "" {
				r.Tenant = "#" + strconv.FormatInt(q.TenantID, 10)
			}
			r.Since, r.SinceISO = opPageTime(q.UncertainAt)
			if r.SinceISO != "" {
				r.SinceISO = q.UncertainAt.UTC().Format(time.RFC3339Nano)
			}
			p.Rows = append(p.Rows, r)
		}
		return render(c, fiber.StatusOK, views.QueuePage(p))
	}
}
