package web

import (
	"encoding/json"
	"errors"
	"slices"
	"time"

	"github.com/gofiber/fiber/v2"
	"github.com/idemgate/idemgate/services"
)

// reconciliationsRoute is the bulk reconciliation endpoint for automation (docs/reference.md §10).
const reconciliationsRoute = "/reconciliations"

// reconciliationRequest is the body of POST /v1/reconciliations: job_id (the client's
// idempotency key for the job), status (succeeded or failed), note (mandatory), and either
// operation_ids or filter.
type reconciliationRequest struct {
	JobID        *string  `json:"job_id"`
	Status       *string  `json:"status"`
	Note         *string  `json:"note"`
	OperationIDs []string `json:"operation_ids"`
	// Filter is decoded as strictly as the body itself (decodeFilter): a misspelt member
	// must be refused, never dropped, since a filter that lost a member selects more
	// operations than the caller meant, and reconciles them.
	Filter json.RawMessage `json:"filter"`
}

// reconciliationFilterFields selects the tenant's uncertain operations by reason (a state
// reason code) and uncertain_before (RFC 3339); both optional.
type reconciliationFilterFields struct {
	Reason          *string `json:"reason"`
	UncertainBefore *string `json:"uncertain_before"`
}

// reconciliationJobResponse is a bulk job as POST /v1/reconciliations answers it. id is the
// server's id of the job, job_id the client's; status is running or completed; results has
// one entry per operation in the job's order (result done or skipped, detail why skipped).
type reconciliationJobResponse struct {
	ID         string                       `json:"id"`
	JobID      string                       `json:"job_id"`
	Actor      string                       `json:"actor"`
	Status     string                       `json:"status"`
	Outcome    string                       `json:"outcome"`
	Note       string                       `json:"note"`
	Selection  string                       `json:"selection"`
	Limited    bool                         `json:"limited"`
	Total      int                          `json:"total"`
	Done       int                          `json:"done"`
	Skipped    int                          `json:"skipped"`
	CreatedAt  time.Time                    `json:"created_at"`
	FinishedAt *time.Time                   `json:"finished_at"`
	Results    []reconciliationItemResponse `json:"results"`
}

// reconciliationItemResponse is what a job did to one operation.
type reconciliationItemResponse struct {
	OperationID string `json:"operation_id"`
	Result      string `json:"result"`
	Detail      string `json:"detail,omitempty"`
}

func toReconciliationJobResponse(j *services.ReconciliationJob) reconciliationJobResponse {
	r := reconciliationJobResponse{ID: j.ID, JobID: j.JobID, Actor: j.Actor, Status: j.Status, Outcome: j.Outcome,
		Note: j.Note, Selection: j.Selection, Limited: j.Limited, Total: j.Total, Done: j.Done, Skipped: j.Skipped,
		CreatedAt: j.CreatedAt, FinishedAt: j.FinishedAt, Results: make([]reconciliationItemResponse, 0, len(j.Items))}
	for _, it := range j.Items {
		r.Results = append(r.Results, reconciliationItemResponse{OperationID: it.OperationID, Result: it.Result, Detail: it.Detail})
	}
	return r
}

// decodeReconciliation reads a POST /v1/reconciliations body strictly (decodeJSON). Errors:
// services.ErrInvalidRequest; the service validates the values.
func decodeReconciliation(body []byte) (services.BulkReconcileInput, error) {
	var req reconciliationRequest
	if err := decodeJSON(body, &req); err != nil {
		return services.BulkReconcileInput{}, err
	}
	var missing []string
	for name, v := range map[string]*string{"job_id": req.JobID, "status": req.Status, "note": req.Note} {
		if v == nil {
			missing = append(missing, name)
		}
	}
	if len(missing) > 0 {
		slices.Sort(missing)
		return services.BulkReconcileInput{}, required(missing...)
	}
	in := services.BulkReconcileInput{JobID: *req.JobID, Status: *req.Status, Note: *req.Note, OperationIDs: req.OperationIDs}
	if len(req.Filter) > 0 && string(req.Filter) != "null" {
		f, err := decodeFilter(req.Filter)
		if err != nil {
			return services.BulkReconcileInput{}, err
		}
		in.Filter = f
	}
	return in, nil
}

// decodeFilter reads the filter member of POST /v1/reconciliations with decodeJSON's rules
// (known members only, each once, no coercion); field errors are named filter.<member>.
// uncertain_before is RFC 3339 (docs/reference.md §10). Errors: services.ErrInvalidRequest.
func decodeFilter(raw json.RawMessage) (*services.BulkFilter, error) {
	var ff reconciliationFilterFields
	if err := decodeJSON(raw, &ff); err != nil {
		var se *services.Error
		if errors.As(err, &se) {
			prefixed := *se
			prefixed.Fields = nil
			for _, fe := range se.Fields {
				prefixed.Fields = append(prefixed.Fields, services.FieldError{Field: "filter." + fe.Field, Message: fe.Message})
			}
			if len(prefixed.Fields) == 0 {
				prefixed.Message = "The request has invalid fields."
				prefixed.Fields = []services.FieldError{{Field: "filter", Message: "must be a JSON object of reason and uncertain_before"}}
			}
			return nil, &prefixed
		}
		return nil, err
	}
	f := &services.BulkFilter{}
	if ff.Reason != nil {
		f.Reason = *ff.Reason
	}
	if ff.UncertainBefore != nil {
		t, err := time.Parse(time.RFC3339Nano, *ff.UncertainBefore)
		if err != nil {
			return nil, fieldError("filter.uncertain_before", "must be an RFC 3339 time such as 2026-12-01T00:00:00Z")
		}
		f.UncertainBefore = t.UTC()
	}
	return f, nil
}

// handleReconciliations is POST /v1/reconciliations: a bulk reconciliation of the key's
// tenant, recorded as api:<key prefix>. 201 with the job when this request created it, 200
// with the same job for a repeat of its job_id (nothing changes twice); 409 job_id_reused
// when the job_id names a job with another outcome, note or selection.
func handleReconciliations(rc *services.Reconciliation) fiber.Handler {
	return func(c *fiber.Ctx) error {
		in, err := decodeReconciliation(c.Body())
		if err != nil {
			return err
		}
		job, err := rc.BulkReconcileForAPI(c.UserContext(), principal(c), in)
		if err != nil {
			return err
		}
		status := fiber.StatusOK
		if job.Created {
			status = fiber.StatusCreated
		}
		return c.Status(status).JSON(toReconciliationJobResponse(job))
	}
}
