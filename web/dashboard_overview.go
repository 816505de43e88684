package web

import (
	"net/url"

	"github.com/gofiber/fiber/v2"
	"github.com/idemgate/idemgate/services"
	"github.com/idemgate/idemgate/views"
)

// handleOverviewPage is GET /?range=: counts by state, the number needing reconciliation, and
// the attempts of the last 24 hours (range 24h, the default) or 7 days (7d), for the tenants
// the operator may see. Every role may view it.
func handleOverviewPage(s *Server) fiber.Handler {
	return func(c *fiber.Ctx) error {
		op := currentOperator(c)
		if op == nil {
			return redirectToLogin(c)
		}
		rng, err := services.ParseOverviewRange(c.Query("range"))
		if err != nil {
			return s.renderErrorPage(c, fiber.StatusBadRequest, "Range must be 24 hours or 7 days.")
		}
		ov, err := s.dash.OverviewFor(c.UserContext(), op.TenantID, rng)
		if err != nil {
			return err
		}
		nav, err := s.navFor(c, op, "overview")
		if err != nil {
			return err
		}
		return render(c, fiber.StatusOK, views.OverviewPage(overviewProps(nav, ov, rng)))
	}
}

// overviewProps formats the service's figures for the page; times are UTC.
func overviewProps(nav views.Nav, ov *services.Overview, rng services.OverviewRange) views.OverviewProps {
	p := views.OverviewProps{
		Nav:                 nav,
		NeedsReconciliation: ov.NeedsReconciliation,
		NeedsURL:            queueURL,
		AsOf:                ov.Now.UTC().Format("2006-01-02 15:04:05"),
		Counts:              make([]views.StateCountView, 0, len(ov.Counts)),
		Hours:               make([]views.ChartHour, 0, len(ov.Hours)),
		SelfURL:             overviewURL(rng),
		ChartTitle:          "Attempts per hour, last 24 hours (UTC)",
		BucketName:          "Hour (UTC)",
	}
	if rng == services.Range7d {
		p.ChartTitle, p.BucketName = "Attempts per 6 hours, last 7 days (UTC)", "6 hours from (UTC)"
	}
	for _, r := range []struct {
		r     services.OverviewRange
		label string
	}{{services.Range24h, "24 hours"}, {services.Range7d, "7 days"}} {
		p.Ranges = append(p.Ranges, views.RangeLink{Label: r.label, URL: overviewURL(r.r), Current: r.r == rng})
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
	for i, h := range ov.Hours {
		start := h.Start.UTC()
		ch := views.ChartHour{
			Label:     start.Format("15:04"),
			Range:     start.Format("2006-01-02 15:04") + "–" + start.Add(ov.Bucket).Format("15:04") + " UTC",
			ShowLabel: i%3 == 0,
			Admitted:  h.Admitted, Duplicates: h.Duplicates, Conflicts: h.Conflicts,
		}
		if rng == services.Range7d {
			// One label a day, at its midnight: "Mon 2".
			ch.Label, ch.ShowLabel = start.Format("Mon 2"), start.Hour() == 0
		}
		p.Hours = append(p.Hours, ch)
	}
	return p
}

// keysStateURL is the Keys page filtered to one state.
func keysStateURL(state string) string {
	return "/keys?" + url.Values{"state": {state}}.Encode()
}

// overviewURL is the Overview for range r; the default range has no parameter.
func overviewURL(r services.OverviewRange) string {
	if r == services.Range24h {
		return "/"
	}
	return "/?" + url.Values{"range": {string(r)}}.Encode()
}
