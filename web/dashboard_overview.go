package web

import (
	"net/url"
	"time"

	"github.com/gofiber/fiber/v2"
	"github.com/idemgate/idemgate/services"
	"github.com/idemgate/idemgate/views"
)

// handleOverviewPage is GET /: counts by state, the number needing reconciliation, and the
// last 24 hours of attempts, for the tenants the operator may see. Every role may view it.
func handleOverviewPage(s *Server) fiber.Handler {
	return func(c *fiber.Ctx) error {
		op := currentOperator(c)
		if op == nil {
			return redirectToLogin(c)
		}
		ov, err := s.dash.Overview(c.UserContext(), op.TenantID)
		if err != nil {
			return err
		}
		nav, err := s.navFor(c, op, "overview")
		if err != nil {
			return err
		}
		return render(c, fiber.StatusOK, views.OverviewPage(overviewProps(nav, ov)))
	}
}

// overviewProps formats the service's figures for the page; times are UTC.
func overviewProps(nav views.Nav, ov *services.Overview) views.OverviewProps {
	p := views.OverviewProps{
		Nav:                 nav,
		NeedsReconciliation: ov.NeedsReconciliation,
		NeedsURL:            queueURL,
		AsOf:                ov.Now.UTC().Format("2006-01-02 15:04:05"),
		Counts:              make([]views.StateCountView, 0, len(ov.Counts)),
		Hours:               make([]views.ChartHour, 0, len(ov.Hours)),
	}
	if ov.OldestUncertainAge > 0 {
		p.OldestUncertain = formatAge(ov.OldestUncertainAge)
	}
	for _, sc := range ov.Counts {
		u := keysStateURL(sc.State)
		if services.NeedsReconciliation(sc.State) {
			// The count is of operations, superseded ones included, which a listing of keys by
			// their newest operation would miss: the queue lists exactly these.
			u = queueURL
		}
		p.Counts = append(p.Counts, views.StateCountView{State: sc.State, Count: sc.Count, URL: u})
	}
	for _, h := range ov.Hours {
		start := h.Start.UTC()
		p.Hours = append(p.Hours, views.ChartHour{
			Label:    start.Format("15:04"),
			Range:    start.Format("2006-01-02 15:04") + "–" + start.Add(time.Hour).Format("15:04") + " UTC",
			Admitted: h.Admitted, Duplicates: h.Duplicates, Conflicts: h.Conflicts,
		})
	}
	return p
}

// keysStateURL is the Keys page filtered to one state.
func keysStateURL(state string) string {
	return "/keys?" + url.Values{"state": {state}}.Encode()
}
