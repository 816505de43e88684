package web

import (
	"context"
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

// queueReasons are the reason filter's choices: the reasons an operation becomes uncertain for.
var queueReasons = []views.Option{
	{Value: services.ReasonTTLExpired, Label: humanReason(services.ReasonTTLExpired)},
	{Value: "lease_expired_without_outcome", Label: humanReason("lease_expired_without_outcome")},
	{Value: services.ReasonReportedUncertain, Label: humanReason(services.ReasonReportedUncertain)},
}

// queueFilter turns the page's filter into the service's, and the tenant to list: a global
// account's tenant choice, else the account's own tenant (a restricted account's tenant
// parameter is ignored: it sees one tenant anyway).
func (s *Server) queueFilter(ctx context.Context, acct *services.OperatorAccount, q queueQuery, limit int) (*int64, services.OperationFilter, error) {
	tenant := acct.TenantID
	if services.SeesAllTenants(acct) && q.Tenant != "" {
		id, err := s.tenantID(ctx, q)
		if err != nil {
			return nil, services.OperationFilter{}, err
		}
		tenant = id
	}
	before, _ := q.before()
	return tenant, services.OperationFilter{Limit: limit, Cursor: q.Cursor, Back: q.Back, Reason: q.Reason, UncertainBefore: before}, nil
}

// nextInQueue returns the oldest operation of acct's queue under q's filter, nil when the
// queue is empty: where the operator goes after recording an outcome from the queue.
func (s *Server) nextInQueue(ctx context.Context, acct *services.OperatorAccount, q queueQuery) (*services.QueuedOperation, error) {
	tenant, f, err := s.queueFilter(ctx, acct, q.filterOnly(), 1)
	if err != nil {
		return nil, err
	}
	page, err := s.dash.ReconciliationQueue(ctx, tenant, f)
	if err != nil || len(page.Items) == 0 {
		return nil, err
	}
	return &page.Items[0], nil
}

// handleQueuePage is GET /reconciliation?tenant=&reason=&before=&cursor=: every operation in
// state uncertain that the account may see, superseded or not, oldest first by the time it
// became uncertain — the same rows the Overview counts as needing reconciliation — narrowed by
// the filter. Each row links to its operation page with the queue as the way back, so
// recording an outcome there moves on to the next item.
func handleQueuePage(s *Server) fiber.Handler {
	return func(c *fiber.Ctx) error {
		op := currentOperator(c)
		if op == nil {
			return redirectToLogin(c)
		}
		q, problem := parseQueueQuery(queryValues(c))
		if problem != "" {
			return s.renderErrorPage(c, fiber.StatusBadRequest, problem)
		}
		tenant, f, err := s.queueFilter(c.UserContext(), op, q, queuePageSize)
		if err != nil {
			return err
		}
		page, err := s.dash.ReconciliationQueue(c.UserContext(), tenant, f)
		var de *services.Error
		if errors.As(err, &de) && de.Code == services.CodeInvalidRequest {
			if len(de.Fields) == 1 && (de.Fields[0].Field == "cursor" || de.Fields[0].Field == "back") {
				return s.renderErrorPage(c, fiber.StatusBadRequest, "This page link is not valid any more. Start again from the first page.")
			}
			return s.renderErrorPage(c, fiber.StatusBadRequest, filterProblem(de))
		} else if err != nil {
			return err
		}
		nav, err := s.navFor(c, op, "reconciliation")
		if err != nil {
			return err
		}
		self := q.url()
		p := views.QueueProps{Nav: nav, ShowTenant: services.SeesAllTenants(op), Rows: make([]views.QueueRow, 0, len(page.Items)),
			Filter: views.QueueFilter{Tenant: q.Tenant, Reason: q.Reason, Before: q.Before, Reasons: queueReasons,
				Active: q.active(), ResetURL: queueURL}}
		if p.ShowTenant {
			ts, err := s.dash.Tenants(c.UserContext())
			if err != nil {
				return err
			}
			for _, t := range ts {
				p.Filter.Tenants = append(p.Filter.Tenants, views.Option{Value: t.Name, Label: t.Name})
			}
		}
		if p.Total, err = s.dash.CountQueue(c.UserContext(), tenant, f); err != nil {
			return err
		}
		p.Bulk = bulkForm(c, op, q)
		if page.PrevCursor != "" {
			p.FirstURL = q.filterOnly().url()
			prev := q.filterOnly()
			prev.Back = page.PrevCursor
			p.PrevURL = prev.url()
		}
		if page.NextCursor != "" {
			next := q.filterOnly()
			next.Cursor = page.NextCursor
			p.NextURL = next.url()
		}
		if id := c.Query("recorded"); id != "" {
			p.Flash = s.recordedFlash(c, op, id, nil)
		}
		now := time.Now()
		for i := range page.Items {
			it := &page.Items[i]
			r := views.QueueRow{OperationID: it.ID, URL: withBack(operationURL(it.ID), self), Key: it.Key, Tenant: it.TenantName,
				Operation: opText(it.Operation.Operation), FencingToken: strconv.FormatInt(it.FencingToken, 10),
				Reason: humanReason(queueReason(it.StateReason)), ReasonCode: queueReason(it.StateReason), Superseded: it.Superseded}
			if r.Tenant == "" {
				r.Tenant = "#" + strconv.FormatInt(it.TenantID, 10)
			}
			if !it.UncertainAt.IsZero() {
				r.Since, _ = opPageTime(it.UncertainAt)
				r.SinceISO = it.UncertainAt.UTC().Format(time.RFC3339Nano)
				r.Age = formatAge(now.Sub(it.UncertainAt))
			}
			p.Rows = append(p.Rows, r)
		}
		return render(c, fiber.StatusOK, views.QueuePage(p))
	}
}

// handleQueueNext is GET /reconciliation/next?<filter>: the overview's "Reconcile next"
// button. It redirects (303) to the oldest queue item's page, with the queue as the way
// back, or to the (empty) queue.
func handleQueueNext(s *Server) fiber.Handler {
	return func(c *fiber.Ctx) error {
		op := currentOperator(c)
		if op == nil {
			return redirectToLogin(c)
		}
		q, problem := parseQueueQuery(queryValues(c))
		if problem != "" {
			return s.renderErrorPage(c, fiber.StatusBadRequest, problem)
		}
		q = q.filterOnly()
		next, err := s.nextInQueue(c.UserContext(), op, q)
		if err != nil {
			return err
		}
		if next == nil {
			return c.Redirect(q.url(), fiber.StatusSeeOther)
		}
		return c.Redirect(withBack(operationURL(next.ID), q.url()), fiber.StatusSeeOther)
	}
}

// recordedFlash is the message after an outcome recorded from the queue: "Recorded succeeded
// for key K — next: key N", or that the queue is empty. It is built from the database, never
// from the link's text, so a crafted link cannot put words on the page; an id the account
// may not see gives "".
func (s *Server) recordedFlash(c *fiber.Ctx, acct *services.OperatorAccount, id string, next *services.OperatorOperation) string {
	d, err := s.dash.OperationForOperator(c.UserContext(), acct, id)
	if err != nil || d.Outcome == nil {
		return ""
	}
	msg := "Recorded " + d.Outcome.Status + " for " + d.Key
	if next != nil {
		return msg + " — next: " + next.Key + "."
	}
	return msg + " — the queue is empty."
}

// queryValues is the request's query string as url.Values.
func queryValues(c *fiber.Ctx) url.Values {
	v := url.Values{}
	c.Context().QueryArgs().VisitAll(func(k, val []byte) {
		v[string(k)] = append(v[string(k)], string(val))
	})
	return v
}

// queueReason is the reason code an uncertain operation is listed under: its state_reason, or
// services.ReasonReportedUncertain when it has none (its caller reported it uncertain).
func queueReason(stateReason *string) string {
	if stateReason == nil || *stateReason == "" {
		return services.ReasonReportedUncertain
	}
	return *stateReason
}
