package web

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/gofiber/fiber/v2"
	"github.com/google/uuid"
	"github.com/idemgate/idemgate/services"
	"github.com/idemgate/idemgate/services/playback"
	"github.com/idemgate/idemgate/views"
)

// exploreURL is the Explore page (docs/reference.md §5 "Explore"): a step-through playback of
// one sandbox key's life, for every role.
const exploreURL = "/explore"

// exploreScript is each step's title and the one sentence on why it is answered as it is,
// for steps 1 to playback.Steps. The sentences describe what services answer; the playback's
// tests (services/playback) fail if the answers change.
var exploreScript = [playback.Steps]struct{ title, why string }{
	{"Acquire the key",
		"Nobody holds the key, so this attempt is admitted with fencing token 1 and an owner token, and may charge now; admission is permission to try, not proof that the charge happened."},
	{"The same request again",
		"A retry (a timeout, a redelivered webhook) asks while attempt 1 holds the key: it is answered 200 duplicate, naming the holder, and must not charge."},
	{"The same key with other parameters",
		"The fingerprint differs from the holder's, so this is another request reusing the key by mistake: it is refused with 422 and nothing changes."},
	{"The TTL passes with no outcome",
		"Attempt 1 never reported, so when its TTL runs out nobody knows whether the card was charged: the operation becomes uncertain and waits in the reconciliation queue, and the key may be admitted again."},
	{"A retry after expiry",
		"The key is admitted again with fencing token 2, and previous_operation warns that attempt 1 may have charged: check with the destination (the payment processor) before charging again."},
	{"The new holder records succeeded",
		"Attempt 2 charged and records succeeded with its receipt; from now on a duplicate is answered with the stored outcome and response instead of charging."},
	{"A late release with attempt 1's owner token",
		"Attempt 1 wakes up and tries to release the key with its old owner token; the owner check refuses it, because the key's current generation is attempt 2's, and nothing changes."},
	{"An operator reconciles attempt 1",
		"An operator (role admin or operator) checks the processor, finds no charge for attempt 1 and records failed with a note saying how they know; nothing is uncertain any more."},
}

// parseExploreState reads the playback id and step of the Explore page's URL and forms: id a
// UUID ("" allowed when optional, before the first step), step 0 to playback.Steps ("" is 0).
// The error is services.ErrInvalidRequest naming the field, nil when both are valid.
func parseExploreState(id, step string, idRequired bool) (string, int, *services.Error) {
	var fe []services.FieldError
	if id != "" || idRequired {
		u, err := uuid.Parse(id)
		if err != nil || len(id) != 36 {
			fe = append(fe, services.FieldError{Field: "playback", Message: "must be a playback id (a UUID)"})
		} else {
			id = u.String()
		}
	}
	n := 0
	if step != "" {
		var err error
		n, err = strconv.Atoi(step)
		if err != nil || n < 0 || n > playback.Steps || len(step) > 2 {
			fe = append(fe, services.FieldError{Field: "step", Message: "must be a step from 0 to " + strconv.Itoa(playback.Steps)})
		}
	}
	if len(fe) > 0 {
		return "", 0, &services.Error{Code: services.CodeInvalidRequest, Message: "The playback's address is not valid.", Fields: fe}
	}
	return id, n, nil
}

// exploreLocation is the page showing playback id at step n, scrolled to that step.
func exploreLocation(id string, n int) string {
	loc := exploreURL + "?playback=" + url.QueryEscape(id) + "&step=" + strconv.Itoa(n)
	if n > 0 {
		loc += "#step-" + strconv.Itoa(n)
	}
	return loc
}

// handleExplorePage is GET /explore[?playback=&step=]: the playback up to step, played first
// where this process has not played it yet (steps are played once; see playback.Player.Play).
// Without a playback id it is the start of a new one.
func handleExplorePage(s *Server) fiber.Handler {
	return func(c *fiber.Ctx) error {
		acct := currentOperator(c)
		if acct == nil {
			return redirectToLogin(c)
		}
		id, n, de := parseExploreState(c.Query("playback"), c.Query("step"), false)
		if de != nil {
			return s.renderErrorPage(c, fiber.StatusBadRequest, fieldProblems(de, nil))
		}
		var (
			pb  *playback.Playback
			err error
		)
		if id == "" {
			id, n = uuid.NewString(), 0
		} else if pb, err = s.play(c, acct, id, n); err != nil {
			return s.playbackFailed(c, err)
		}
		nav, err := s.navFor(c, acct, "explore")
		if err != nil {
			return err
		}
		return render(c, fiber.StatusOK, views.ExplorePage(exploreProps(nav, id, n, pb)))
	}
}

// handleExploreNext is POST /explore/next (form: playback, step): play the step after step
// and show it (303). A step already played (a second tab, a resubmitted form) is shown, not
// played again.
func handleExploreNext(s *Server) fiber.Handler {
	return func(c *fiber.Ctx) error {
		acct := currentOperator(c)
		id, n, de := parseExploreState(c.FormValue("playback"), c.FormValue("step"), true)
		if de != nil {
			return s.renderErrorPage(c, fiber.StatusBadRequest, fieldProblems(de, nil))
		}
		n = min(n+1, playback.Steps)
		if _, err := s.play(c, acct, id, n); err != nil {
			return s.playbackFailed(c, err)
		}
		return c.Redirect(exploreLocation(id, n), fiber.StatusSeeOther)
	}
}

// handleExploreReset is POST /explore/reset: a new playback, in a new tenant, from the start
// (the page makes a new playback id). What the old one played stays in the sandbox until the
// sandbox is replaced (playback.Player).
func handleExploreReset() fiber.Handler {
	return func(c *fiber.Ctx) error {
		return c.Redirect(exploreURL, fiber.StatusSeeOther)
	}
}

// play plays the request's playback up to step n within three quarters of the time left
// to the request (Config.StoreTimeout), so a sandbox that takes all of its own time still
// leaves the error page the time to render its navigation.
func (s *Server) play(c *fiber.Ctx, acct *services.OperatorAccount, id string, n int) (*playback.Playback, error) {
	ctx := c.UserContext()
	if dl, ok := ctx.Deadline(); ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, time.Now().Add(time.Until(dl)*3/4))
		defer cancel()
	}
	return s.player.Play(ctx, acct, id, n)
}

// playbackFailed answers a playback whose sandbox store failed: 503, the cause logged. The
// error page reads the account's tenant for its navigation; when the sandbox used up the
// request's time (SQLite's lock wait does not watch the context), that read gets a second of
// its own, so the answer is still the site's page and not a bare message.
func (s *Server) playbackFailed(c *fiber.Ctx, err error) error {
	if c.UserContext().Err() != nil {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(c.UserContext()), time.Second)
		defer cancel()
		c.SetUserContext(ctx)
	}
	if errors.Is(err, playback.ErrClosed) {
		return s.renderErrorPage(c, fiber.StatusServiceUnavailable, "The server is shutting down; try again in a moment.")
	}
	s.log.ErrorContext(c.UserContext(), "playback failed", "err", err)
	return s.renderErrorPage(c, fiber.StatusServiceUnavailable, "The playback's sandbox store failed; try again, or Reset playback.")
}

// exploreProps is the page of playback pb (nil before its first step) shown up to step n.
func exploreProps(nav views.Nav, id string, n int, pb *playback.Playback) views.ExploreProps {
	p := views.ExploreProps{Nav: nav, CSRFToken: nav.CSRFToken, PlaybackID: id, Step: n, Steps: playback.Steps,
		TTL: strconv.Itoa(int(playback.TTL/time.Minute)) + " min"}
	if pb != nil && n > 0 {
		p.Key, p.Tenant, p.Restarted = pb.Key, pb.Tenant, pb.Restarted
		for _, st := range pb.Steps[:min(n, len(pb.Steps))] {
			p.Played = append(p.Played, exploreStep(st, pb.Tenant))
		}
	}
	for i := n; i < playback.Steps; i++ {
		p.Upcoming = append(p.Upcoming, views.ExploreUpcoming{N: i + 1, Title: exploreScript[i].title})
	}
	return p
}

func exploreStep(st playback.Step, tenant string) views.ExploreStep {
	v := views.ExploreStep{N: st.N, Title: exploreScript[st.N-1].title, Why: exploreScript[st.N-1].why}
	var statuses []string
	for i := range st.Exchanges {
		ex := exploreExchange(&st.Exchanges[i], tenant)
		ex.Label = "step " + strconv.Itoa(st.N) + ", call " + strconv.Itoa(i+1)
		if ex.Status != "" {
			statuses = append(statuses, ex.Status)
		}
		v.Exchanges = append(v.Exchanges, ex)
	}
	v.Statuses = strings.Join(statuses, " · ")
	for _, o := range st.Timeline {
		g := views.ExploreGeneration{FencingToken: strconv.FormatInt(o.FencingToken, 10), OperationID: o.ID, State: o.State,
			Holds: o.Held}
		if o.StateReason != nil {
			g.Reason = *o.StateReason
		}
		if out := o.Outcome; out != nil {
			g.Outcome = out.Status
			if out.Receipt != nil {
				g.Outcome += ", receipt " + *out.Receipt
			}
			g.Outcome += ", recorded by " + out.RecordedBy
		}
		v.Timeline = append(v.Timeline, g)
	}
	return v
}

// exploreExchange renders one call with the JSON API's own request and response types and
// status rules (api.go, errors.go), so the page shows the wire format exactly.
func exploreExchange(ex *playback.Exchange, tenant string) views.ExploreExchange {
	auth := "\nAuthorization: Bearer <API key of tenant " + tenant + ">"
	const jsonBody = "\nContent-Type: application/json\n\n"
	var (
		v     views.ExploreExchange
		route string // the route whose status rules apply to a refusal
		ok    any    // the answer's body when not refused
	)
	status := http.StatusOK
	switch ex.Call {
	case playback.CallClock:
		mins := strconv.Itoa(int(ex.Elapsed / time.Minute))
		v.Note = "No request. Instead of making you wait " + mins + " min, the sandbox moves this key's deadlines " + mins +
			" min earlier (so from now on attempt 1's expires_at and lease_expires_at read " + mins +
			" min before the TTL it was granted; the times of what happened keep their values), then its reaper makes a pass, " +
			"as a deployment's does every 30 s by default (IDEMGATE_REAP_INTERVAL)."
		if ex.Err != nil {
			v.Note += " It failed: " + ex.Err.Error()
		}
		return v
	case playback.CallAcquire:
		in := ex.Acquire
		ttl := in.TTLSeconds
		v.Method, v.Path, route = "POST", "/v1/acquire", "/v1/acquire"
		v.Request = auth + jsonBody + pretty(acquireRequest{Key: &in.Key, TTLSeconds: &ttl, Operation: in.Operation,
			Fingerprint: in.Fingerprint})
		if ex.Acquisition != nil {
			status, ok = acquireAnswer(ex.Acquisition)
		}
	case playback.CallListUncertain:
		v.Method, v.Path, route = "GET", "/v1/operations?state=uncertain", "/v1/operations"
		v.Request = auth
		ok = toOperationList(ex.Queue, ex.QueueNext)
	case playback.CallOutcome:
		in := ex.Outcome
		v.Method, v.Path, route = "POST", "/v1/operations/"+ex.OperationID+"/outcome", outcomeRoute
		v.Request = auth + jsonBody + pretty(outcomeRequest{OwnerToken: &in.OwnerToken, Status: &in.Status,
			Receipt: in.Receipt, Response: in.Response})
		if ex.Operation != nil {
			ok = toOperationDTO(ex.Operation)
		}
	case playback.CallRelease:
		in := ex.Release
		v.Method, v.Path, route = "POST", "/v1/release", "/v1/release"
		v.Request = auth + jsonBody + pretty(releaseRequest{Key: &in.Key, OwnerToken: &in.OwnerToken, Reason: in.Reason})
		if ex.Operation != nil {
			ok = releaseResponse{Released: true, Operation: toOperationDTO(ex.Operation)}
		}
	case playback.CallReconcile:
		// The dashboard's form, as the operation page posts it; the answer is its redirect.
		in := ex.Reconcile
		v.Method, v.Path = "POST", operationURL(ex.OperationID)+"/outcome"
		// The fields in the operation page's order; the session is an operator's, since a
		// read-only account's POST is refused (403).
		form := "_csrf=<the page's token>&status=" + url.QueryEscape(in.Status) + "&receipt=&note=" + url.QueryEscape(in.Note)
		v.Request = "\nCookie: <an operator's dashboard session>\nContent-Type: application/x-www-form-urlencoded\n\n" + form
		if ex.Err == nil {
			v.Status, v.StatusText = "303", http.StatusText(http.StatusSeeOther)
			v.Answer = "\nLocation: " + operationURL(ex.OperationID) + "?done=outcome"
			return v
		}
	case playback.CallGetOperation:
		v.Method, v.Path, route = "GET", "/v1/operations/"+ex.OperationID, "/v1/operations/:id"
		v.Request = auth
		if ex.Detail != nil {
			ok = toOperationDetailDTO(ex.Detail)
		}
	}
	body := ok
	ctype := fiber.MIMEApplicationJSON
	if ex.Err != nil {
		de, _ := toDomainError(ex.Err, services.MaxBodyBytes)
		status = statusOnRoute(route, de)
		body = newProblem(status, de, ex.RequestID)
		ctype = "application/problem+json"
		v.Refused = status < http.StatusInternalServerError
	}
	v.Status, v.StatusText = strconv.Itoa(status), http.StatusText(status)
	v.Answer = "\nContent-Type: " + ctype + "\nX-Request-Id: " + ex.RequestID + "\n\n" + pretty(body)
	return v
}

// pretty is v as the API encodes it, indented for reading.
func pretty(v any) string {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil { // the DTOs always encode
		return err.Error()
	}
	return strings.TrimSuffix(b.String(), "\n")
}
