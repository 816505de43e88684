package web

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/gofiber/fiber/v2"
	"github.com/idemgate/idemgate/services"
	"github.com/idemgate/idemgate/views"
)

// operationFlashes are the only messages a ?done= parameter can show, so a crafted link cannot put
// arbitrary text on the page.
var operationFlashes = map[string]string{
	"outcome":  "Outcome recorded.",
	"released": "Key released.",
}

// outcomeChoices are the outcome form's choices: the states an operator's confirmed outcome
// may set.
var outcomeChoices = []views.Option{
	{Value: services.StateSucceeded, Label: "Succeeded — the effect happened"},
	{Value: services.StateFailed, Label: "Failed — no effect"},
}

// requireActor refuses the dashboard's state-changing requests to read-only accounts
// (auditors), even when the form was crafted by hand with a valid CSRF token. An operation the
// account may not see answers 404 first, as its page does: a 403 would confirm that another
// tenant's operation exists.
func (s *Server) requireActor(c *fiber.Ctx) error {
	if services.MayAct(currentOperator(c)) {
		return c.Next()
	}
	err := s.recon.CheckMayAct(c.UserContext(), currentOperator(c), c.Params("id"))
	if errors.Is(err, services.ErrNotFound) {
		return s.renderErrorPage(c, fiber.StatusNotFound, "There is no such operation, or your account may not see it.")
	} else if err != nil && !errors.Is(err, services.ErrUnauthorized) {
		return err
	}
	return s.renderErrorPage(c, fiber.StatusForbidden, "Your account is read-only: it may view operations but not change them. Nothing was done.")
}

// operationURL is the detail page of operation id.
func operationURL(id string) string { return "/operations/" + url.PathEscape(id) }

// handleOperationPage is GET /operations/{id}.
func handleOperationPage(s *Server) fiber.Handler {
	return func(c *fiber.Ctx) error {
		form := operationForm{flash: operationFlashes[c.Query("done")], back: safeBack(c.Query("back"))}
		if id := c.Query("recorded"); id != "" {
			if d, err := s.dash.OperationForOperator(c.UserContext(), currentOperator(c), c.Params("id")); err == nil {
				form.flash = s.recordedFlash(c, currentOperator(c), id, d)
			}
		}
		return s.renderOperation(c, fiber.StatusOK, form)
	}
}

// handleOperationOutcome is POST /operations/{id}/outcome: record a confirmed outcome, then
// back to the page (303) with a flash, or the page again with the refusal. Opened from the
// reconciliation queue (the form's back field is the queue), it goes on to the queue's next
// item instead, or to the queue when it is empty, with a flash naming what was recorded.
func handleOperationOutcome(s *Server) fiber.Handler {
	return func(c *fiber.Ctx) error {
		form := operationForm{outcome: views.OutcomeFormValues{
			Status: c.FormValue("status"), Receipt: c.FormValue("receipt"), Note: c.FormValue("note"),
		}, back: safeBack(c.FormValue("back"))}
		in := services.ReconcileInput{Status: form.outcome.Status, Note: form.outcome.Note}
		if form.outcome.Receipt != "" {
			r := form.outcome.Receipt
			in.Receipt = &r
		}
		op, err := s.recon.ReconcileOutcome(c.UserContext(), currentOperator(c), c.Params("id"), in)
		if err == nil && isQueueBack(form.back) {
			return s.redirectToNext(c, op.ID, form.back)
		}
		if err == nil {
			loc := operationURL(op.ID) + "?done=outcome"
			if form.back != "" {
				loc += "&back=" + url.QueryEscape(form.back)
			}
			return c.Redirect(loc, fiber.StatusSeeOther)
		}
		return s.refuseAction(c, err, "Not recorded: ", form)
	}
}

// handleOperationRelease is POST /operations/{id}/release: the owner-checked release of the
// operation and fencing token the operator saw. A refusal names the key's current holder.
func handleOperationRelease(s *Server) fiber.Handler {
	return func(c *fiber.Ctx) error {
		form := operationForm{release: views.ReleaseFormValues{Reason: c.FormValue("reason")}}
		if c.FormValue("confirm") != "yes" {
			form.status, form.problem = fiber.StatusBadRequest, "Not released: tick the confirmation box to release the key. Nothing was changed."
			return s.renderOperation(c, form.status, form)
		}
		fencing, _ := strconv.ParseInt(c.FormValue("fencing_token"), 10, 64) // the service refuses 0
		op, err := s.recon.OperatorRelease(c.UserContext(), currentOperator(c), c.Params("id"), services.OperatorReleaseInput{
			OperationID: c.FormValue("operation_id"), FencingToken: fencing, Reason: form.release.Reason,
		})
		if err == nil {
			return c.Redirect(operationURL(op.ID)+"?done=released", fiber.StatusSeeOther)
		}
		return s.refuseAction(c, err, "Not released: ", form)
	}
}

// redirectToNext answers an outcome recorded from the queue back (a value of safeBack): 303 to
// the queue's next item under the same filter, or to the queue when it is empty, each with
// recorded=<id> for the flash.
func (s *Server) redirectToNext(c *fiber.Ctx, recorded, back string) error {
	_, rawQuery, _ := strings.Cut(back, "?")
	v, _ := url.ParseQuery(rawQuery) // safeBack re-encoded it
	q, problem := parseQueueQuery(v)
	if problem != "" {
		q = queueQuery{}
	}
	q = q.filterOnly()
	next, err := s.nextInQueue(c.UserContext(), currentOperator(c), q)
	if err != nil {
		return err
	}
	if next == nil {
		loc := q.url()
		if strings.Contains(loc, "?") {
			loc += "&"
		} else {
			loc += "?"
		}
		return c.Redirect(loc+"recorded="+url.QueryEscape(recorded), fiber.StatusSeeOther)
	}
	return c.Redirect(withBack(operationURL(next.ID), q.url())+"&recorded="+url.QueryEscape(recorded), fiber.StatusSeeOther)
}

// operationForm is the state of the page's action forms after a submission.
type operationForm struct {
	back    string
	status  int
	flash   string
	problem string
	outcome views.OutcomeFormValues
	release views.ReleaseFormValues
}

// refuseAction answers a refused action: the page again with the reason (400 for invalid
// input, 409 for a state that does not allow it), 404 or 403 pages, or the error handler for
// anything unexpected.
func (s *Server) refuseAction(c *fiber.Ctx, err error, prefix string, form operationForm) error {
	var held *services.HeldByAnotherError
	var de *services.Error
	switch {
	case errors.As(err, &held):
		h := held.Holder
		attempt := "no attempt_id"
		if h.AttemptID != nil {
			attempt = "attempt " + *h.AttemptID
		}
		form.status, form.problem = fiber.StatusConflict, fmt.Sprintf(
			"Not released: the key is now held by operation %s (fencing token %d, %s). Nothing was changed.",
			h.OperationID, h.FencingToken, attempt)
	case !errors.As(err, &de):
		return err
	case de.Code == services.CodeNotFound:
		return s.renderErrorPage(c, fiber.StatusNotFound, "There is no such operation, or your account may not see it.")
	case de.Code == services.CodeUnauthorized:
		return s.renderErrorPage(c, fiber.StatusForbidden, de.Message)
	case de.Code == services.CodeInvalidRequest:
		form.status, form.problem = fiber.StatusBadRequest, prefix+fieldProblems(de, operationFormLabels)+" Nothing was changed."
	case de.Code == services.CodeStoreUnavailable:
		return err
	default:
		form.status, form.problem = fiber.StatusConflict, prefix+operationRefusal(de)
	}
	return s.renderOperation(c, form.status, form)
}

// operationRefusal explains a refusal by state in the operator's terms.
func operationRefusal(de *services.Error) string {
	switch de.Code {
	case services.CodeKeyNotHeld:
		return "nobody holds the key any more (the hold was released or expired and was cleared). Nothing was changed."
	case services.CodeEffectConfirmed:
		return "the operation succeeded, so its key stays held until it expires. Nothing was changed."
	case services.CodeOutcomeUncertain:
		return "the operation's outcome is uncertain. Record the confirmed outcome first. Nothing was changed."
	}
	return de.Message
}

// operationFormLabels name the form fields as the page labels them.
var operationFormLabels = map[string]string{
	"status": "Outcome", "receipt": "Receipt", "note": "Note",
	"operation_id": "Operation", "fencing_token": "Fencing token", "reason": "Reason",
}

// renderOperation renders the detail page of the operation in the URL as the signed-in
// account may see it, with form's flash, refusal and typed values.
func (s *Server) renderOperation(c *fiber.Ctx, status int, form operationForm) error {
	acct := currentOperator(c)
	if acct == nil {
		return redirectToLogin(c)
	}
	d, err := s.dash.OperationForOperator(c.UserContext(), acct, c.Params("id"))
	if errors.Is(err, services.ErrNotFound) {
		return s.renderErrorPage(c, fiber.StatusNotFound, "There is no such operation, or your account may not see it.")
	} else if err != nil {
		return err
	}
	nav, err := s.navFor(c, acct, "keys")
	if err != nil {
		return err
	}
	p := operationProps(nav, d)
	p.Flash, p.ActionError, p.Outcome, p.Release = form.flash, form.problem, form.outcome, form.release
	p.Back, p.BackURL, p.BackLabel = form.back, form.back, backLabel(form.back)
	if p.BackURL == "" {
		p.BackURL = "/keys"
	}
	p.OutcomeFirst = d.State == services.StateUncertain
	return render(c, status, views.OperationPage(p))
}

// opPageTime formats t for display (UTC) and for <time datetime>.
func opPageTime(t time.Time) (string, string) {
	if t.IsZero() {
		return "", ""
	}
	return t.UTC().Format("2006-01-02 15:04:05"), t.UTC().Format(time.RFC3339)
}

// opPrettyJSON indents raw JSON for a <pre>; the page shows it as text, never as markup.
// JSON nested deeper than opIndentDepth is shown as stored (compact, at most
// services.MaxResponseBytes): indentation writes two spaces per level on every line, so its
// size grows with the square of the nesting, and 16 KiB of [[[…]]] made a 133 MB page
// (issue 28). Up to that depth the indented text is at most about 2×opIndentDepth+1 times
// the stored size.
func opPrettyJSON(raw json.RawMessage) string {
	if len(raw) == 0 {
		return ""
	}
	if jsonDeeperThan(raw, opIndentDepth) {
		return string(raw)
	}
	var buf bytes.Buffer
	if err := json.Indent(&buf, raw, "", "  "); err != nil {
		return string(raw)
	}
	return buf.String()
}

// opIndentDepth is the deepest nesting opPrettyJSON indents.
const opIndentDepth = 16

// jsonDeeperThan reports whether raw nests arrays and objects more than max levels deep (or
// is not valid JSON, which is then shown as stored too). It reads raw's tokens with
// encoding/json and stops at the first level past max.
func jsonDeeperThan(raw []byte, max int) bool {
	dec := json.NewDecoder(bytes.NewReader(raw))
	depth := 0
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			return false
		} else if err != nil {
			return true
		}
		switch tok {
		case json.Delim('['), json.Delim('{'):
			if depth++; depth > max {
				return true
			}
		case json.Delim(']'), json.Delim('}'):
			depth--
		}
	}
}

func opText(p *string) string {
	if p == nil {
		return ""
	}
	return *p
}

// operationProps maps the service's view of an operation to the page; the service decided
// which action forms the account is offered.
func operationProps(nav views.Nav, d *services.OperatorOperation) views.OperationProps {
	id := d.ID
	v := views.OperationView{
		ID: id, URL: operationURL(id), Key: d.Key, Tenant: d.TenantName, Name: opText(d.Operation.Operation), State: d.State,
		StateReason: humanReason(opText(d.StateReason)), FencingToken: strconv.FormatInt(d.FencingToken, 10),
		CorrelationID: opText(d.CorrelationID), Fingerprint: opText(d.Fingerprint), ReleaseReason: opText(d.ReleaseReason),
		Metadata: opPrettyJSON(d.Metadata), Duplicates: strconv.FormatInt(d.DuplicateAttempts, 10),
		Conflicts: strconv.FormatInt(d.ConflictAttempts, 10), Held: "No",
		OutcomeActionURL: operationURL(id) + "/outcome", ReleaseActionURL: operationURL(id) + "/release",
		ReleaseOperation: id, ReleaseFencingTok: strconv.FormatInt(d.FencingToken, 10),
		AttemptID: d.AdmittedAttemptID(),
	}
	if v.Tenant == "" {
		v.Tenant = "#" + strconv.FormatInt(d.TenantID, 10)
	}
	v.AcquiredAt, v.AcquiredISO = opPageTime(d.AcquiredAt)
	v.ExpiresAt, v.ExpiresISO = opPageTime(d.ExpiresAt)
	v.LeaseExpiresAt, v.LeaseExpiresISO = opPageTime(d.LeaseExpiresAt)
	v.OnExpiry = "readmit after the TTL"
	if d.OnExpiry == services.OnExpiryHold {
		v.OnExpiry = "hold until reconciled"
	}
	v.Retention, v.Horizon = "the installation's (IDEMGATE_RETENTION)", "none: the TTL alone protects the key"
	if d.RetentionSeconds != nil {
		v.Retention = formatTTL(time.Duration(*d.RetentionSeconds) * time.Second)
	}
	if d.HorizonSeconds != nil {
		v.Horizon = formatTTL(time.Duration(*d.HorizonSeconds)*time.Second) + " after a success"
	}
	if d.EvidenceUntil != nil {
		v.EvidenceUntil, v.EvidenceUntilISO = opPageTime(*d.EvidenceUntil)
	}
	if d.ProtectedUntil != nil {
		v.ProtectedUntil, v.ProtectedUntilISO = opPageTime(*d.ProtectedUntil)
	}
	if d.ReleasedAt != nil {
		v.ReleasedAt, v.ReleasedISO = opPageTime(*d.ReleasedAt)
	}
	switch {
	case d.Held:
		v.Held = "Yes"
	case d.HoldsKey:
		v.Held = "Expired, not yet cleared"
	}
	if h := d.Holder; h != nil && h.OperationID != id {
		v.Holder = fmt.Sprintf("%s (fencing token %d)", h.OperationID, h.FencingToken)
		v.HolderURL = operationURL(h.OperationID)
	}
	if o := d.Outcome; o != nil {
		v.HasOutcome, v.OutcomeStatus, v.Receipt, v.Note = true, o.Status, opText(o.Receipt), opText(o.Note)
		v.RecordedBy = o.RecordedBy
		v.RecordedAt, _ = opPageTime(o.RecordedAt)
		v.StoredResponse = opPrettyJSON(o.Response)
	}
	p := views.OperationProps{
		Nav: nav, Op: v,
		Attempts:        make([]views.AttemptRow, 0, len(d.Attempts)),
		Events:          make([]views.EventRow, 0, len(d.Events)),
		Generations:     make([]views.GenerationRow, 0, len(d.Generations)),
		ShowOutcomeForm: d.MayRecordOutcome,
		ShowReleaseForm: d.MayRelease,
		OutcomeChoices:  outcomeChoices,
	}
	for _, a := range d.Attempts {
		r := views.AttemptRow{Result: a.Result, Caller: a.Caller, AttemptID: opText(a.AttemptID)}
		r.At, r.AtISO = opPageTime(a.AttemptedAt)
		p.Attempts = append(p.Attempts, r)
	}
	for _, e := range d.Events {
		r := views.EventRow{Actor: e.Actor, Kind: e.Kind, Detail: e.Detail}
		r.At, r.AtISO = opPageTime(e.CreatedAt)
		p.Events = append(p.Events, r)
	}
	for _, g := range d.Generations {
		at, _ := opPageTime(g.AcquiredAt)
		p.Generations = append(p.Generations, views.GenerationRow{ID: g.ID, FencingToken: strconv.FormatInt(g.FencingToken, 10),
			State: g.State, AcquiredAt: at, URL: operationURL(g.ID), Current: g.ID == id})
	}
	for _, g := range d.PossibleDuplicateOf {
		at, _ := opPageTime(g.AcquiredAt)
		p.PossibleDuplicateOf = append(p.PossibleDuplicateOf, views.GenerationRow{ID: g.ID,
			FencingToken: strconv.FormatInt(g.FencingToken, 10), State: g.State, AcquiredAt: at, URL: operationURL(g.ID)})
	}
	return p
}
