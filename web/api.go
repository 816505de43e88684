package web

import (
	"encoding/json"
	"net/url"
	"strconv"
	"time"

	"github.com/gofiber/fiber/v2"
	"github.com/idemgate/idemgate/services"
)

// required reports a missing required field the same way services reports invalid ones.
func required(fields ...string) error {
	fe := make([]services.FieldError, 0, len(fields))
	for _, f := range fields {
		fe = append(fe, services.FieldError{Field: f, Message: "is required"})
	}
	return &services.Error{Code: services.CodeInvalidRequest, Message: "The request has invalid fields.", Fields: fe}
}

// nullIsAbsent treats a JSON null like an omitted member.
func nullIsAbsent(raw json.RawMessage) json.RawMessage {
	if string(raw) == "null" {
		return nil
	}
	return raw
}

// decodeAcquire reads one acquire request body, as POST /v1/acquire takes it and as each item
// of POST /v1/acquire:batch is: strictly decoded (decodeJSON), key required. ttl_seconds left
// out is 0 for services, which takes the policy's TTL (docs/reference.md §2); a client's zero is
// refused rather than read as "the policy's".
// Errors are services.ErrInvalidRequest; the single endpoint and the batch share it so an item
// is refused exactly as the same body alone would be.
func decodeAcquire(body []byte) (services.AcquireInput, error) {
	var req acquireRequest
	if err := decodeJSON(body, &req); err != nil {
		return services.AcquireInput{}, err
	}
	var missing []string
	if req.Key == nil {
		missing = append(missing, "key")
	}
	if len(missing) > 0 {
		return services.AcquireInput{}, required(missing...)
	}
	var ttl int64
	if req.TTLSeconds != nil {
		// services reads 0 as "absent: the policy's TTL". A client's explicit 0 is passed as -1,
		// which services refuses with every other problem of the request, like any value below 1.
		if ttl = *req.TTLSeconds; ttl == 0 {
			ttl = -1
		}
	}
	return services.AcquireInput{
		Key: *req.Key, TTLSeconds: ttl, Operation: req.Operation, Fingerprint: req.Fingerprint,
		CorrelationID: req.CorrelationID, AttemptID: req.AttemptID, Metadata: nullIsAbsent(req.Metadata),
		LeaseSeconds: req.LeaseSeconds, OnExpiry: req.OnExpiry,
	}, nil
}

// acquireAnswer is the status and body of an acquire that was not refused: 201 with the
// admission, or 200 with the holder's operation for a duplicate.
func acquireAnswer(acq *services.Acquisition) (int, any) {
	if !acq.Admitted {
		return fiber.StatusOK, duplicateResponse{Admitted: false, Key: acq.Key, Operation: toOperationDTO(acq.Operation)}
	}
	resp := admittedResponse{Admitted: true, Key: acq.Key, OperationID: acq.OperationID, OwnerToken: acq.OwnerToken,
		FencingToken: acq.FencingToken, State: acq.State, ExpiresAt: acq.ExpiresAt,
		LeaseExpiresAt: acq.LeaseExpiresAt, OnExpiry: acq.OnExpiry, RetentionSeconds: acq.RetentionSeconds,
		HorizonSeconds: acq.HorizonSeconds, TTLSeconds: acq.TTLSeconds, LeaseSeconds: acq.LeaseSeconds}
	if po := acq.PreviousOperation; po != nil {
		resp.PreviousOperation = &previousOperationDTO{ID: po.ID, State: po.State, FencingToken: po.FencingToken}
		if po.OutcomeStatus != nil {
			resp.PreviousOperation.Outcome = &outcomeRef{Status: *po.OutcomeStatus, Receipt: po.OutcomeReceipt}
		}
	}
	return fiber.StatusCreated, resp
}

func handleAcquire(adm *services.Admission) fiber.Handler {
	return func(c *fiber.Ctx) error {
		in, err := decodeAcquire(c.Body())
		if err != nil {
			return err
		}
		acq, err := adm.Acquire(c.UserContext(), principal(c), in)
		if err != nil {
			return err
		}
		status, body := acquireAnswer(acq)
		return c.Status(status).JSON(body)
	}
}

func handleRelease(adm *services.Admission) fiber.Handler {
	return func(c *fiber.Ctx) error {
		var req releaseRequest
		if err := decodeJSON(c.Body(), &req); err != nil {
			return err
		}
		var missing []string
		if req.Key == nil {
			missing = append(missing, "key")
		}
		if req.OwnerToken == nil {
			missing = append(missing, "owner_token")
		}
		if len(missing) > 0 {
			return required(missing...)
		}
		op, err := adm.Release(c.UserContext(), principal(c), services.ReleaseInput{
			Key: *req.Key, OwnerToken: *req.OwnerToken, Reason: req.Reason})
		if err != nil {
			return err
		}
		return c.JSON(releaseResponse{Released: true, Operation: toOperationDTO(op)})
	}
}

func handleOutcome(adm *services.Admission) fiber.Handler {
	return func(c *fiber.Ctx) error {
		var req outcomeRequest
		if err := decodeJSON(c.Body(), &req); err != nil {
			return err
		}
		if req.OwnerToken == nil {
			return required("owner_token")
		}
		in := services.OutcomeInput{OwnerToken: *req.OwnerToken, Receipt: req.Receipt,
			Response: nullIsAbsent(req.Response), Note: req.Note}
		if req.Status != nil {
			in.Status = *req.Status
		}
		if req.Release != nil {
			in.Release = *req.Release
		}
		op, err := adm.RecordOutcome(c.UserContext(), principal(c), c.Params("id"), in)
		if err != nil {
			return err
		}
		return c.JSON(toOperationDTO(op))
	}
}

// decodeRenew reads a renew body (docs/reference.md §8): strictly decoded, owner_token
// required. An absent lease_seconds is left 0, which RenewInput.Validate refuses only after
// Renew has checked the token: a wrong token is 403 not_owner whatever else is wrong, as for an
// outcome (issue 28). Errors are services.ErrInvalidRequest.
func decodeRenew(body []byte) (services.RenewInput, error) {
	var req renewRequest
	if err := decodeJSON(body, &req); err != nil {
		return services.RenewInput{}, err
	}
	if req.OwnerToken == nil {
		return services.RenewInput{}, required("owner_token")
	}
	in := services.RenewInput{OwnerToken: *req.OwnerToken}
	if req.LeaseSeconds != nil {
		in.LeaseSeconds = *req.LeaseSeconds
	}
	if req.ExtendTTL != nil {
		in.ExtendTTL = *req.ExtendTTL
	}
	return in, nil
}

// handleRenew is POST /v1/operations/{id}/renew: the owner's heartbeat.
func handleRenew(adm *services.Admission) fiber.Handler {
	return func(c *fiber.Ctx) error {
		in, err := decodeRenew(c.Body())
		if err != nil {
			return err
		}
		r, err := adm.Renew(c.UserContext(), principal(c), c.Params("id"), in)
		if err != nil {
			return err
		}
		return c.JSON(renewResponse{OperationID: r.OperationID, LeaseExpiresAt: r.LeaseExpiresAt,
			ExpiresAt: r.ExpiresAt, FencingToken: r.FencingToken})
	}
}

func handleGetKey(reads *services.Reads) fiber.Handler {
	return func(c *fiber.Ctx) error {
		// The router matches the raw (still percent-encoded) path, so "a%2Fb" arrives here
		// intact and is decoded exactly once: "a/b", "x%2Fy" and non-ASCII keys round-trip.
		key, err := url.PathUnescape(c.Params("*"))
		if err != nil || key == "" {
			return services.ErrNotFound
		}
		k, err := reads.GetKey(c.UserContext(), principal(c).TenantID, key)
		if err != nil {
			return err
		}
		return c.JSON(toKeyDTO(k))
	}
}

func queryLimit(c *fiber.Ctx) (int, error) {
	s := c.Query("limit")
	if s == "" {
		return 0, nil
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 || n > services.MaxListLimit {
		return 0, &services.Error{Code: services.CodeInvalidRequest, Message: "The request has invalid fields.",
			Fields: []services.FieldError{{Field: "limit", Message: "must be an integer from 1 to " + strconv.Itoa(services.MaxListLimit)}}}
	}
	return n, nil
}

func handleListKeys(reads *services.Reads) fiber.Handler {
	return func(c *fiber.Ctx) error {
		limit, err := queryLimit(c)
		if err != nil {
			return err
		}
		page, err := reads.ListKeys(c.UserContext(), principal(c).TenantID, services.KeyFilter{
			State: c.Query("state"), Operation: c.Query("operation"), KeyPrefix: c.Query("prefix"), Limit: limit,
			Cursor: c.Query("cursor")})
		if err != nil {
			return err
		}
		resp := keyListResponse{Items: make([]keyDTO, 0, len(page.Items)), NextCursor: cursorPtr(page.NextCursor)}
		for i := range page.Items {
			resp.Items = append(resp.Items, toKeyDTO(&page.Items[i]))
		}
		return c.JSON(resp)
	}
}

// handleGetOperation is GET /v1/operations/{id}, with ?wait= a long poll (docs/reference.md
// §8): the Awaiter answers as soon as the operation leaves in_progress, or at the wait's end.
func handleGetOperation(reads *services.Reads, aw *services.Awaiter) fiber.Handler {
	return func(c *fiber.Ctx) error {
		wait, err := parseWait(c.Query("wait"))
		if err != nil {
			return err
		}
		var d *services.OperationDetail
		if wait > 0 && aw != nil {
			ctx, cancel := waitContext(c)
			d, err = aw.Wait(ctx, principal(c).TenantID, c.Params("id"), wait)
			cancel()
		} else {
			d, err = reads.GetOperation(c.UserContext(), principal(c).TenantID, c.Params("id"))
		}
		if err != nil {
			return err
		}
		return c.JSON(toOperationDetailDTO(d))
	}
}

// toOperationDetailDTO is the body of GET /v1/operations/{id}.
func toOperationDetailDTO(d *services.OperationDetail) operationDetailDTO {
	resp := operationDetailDTO{operationDTO: toOperationDTO(&d.Operation),
		Attempts: make([]attemptDTO, 0, len(d.Attempts)), Events: make([]eventDTO, 0, len(d.Events))}
	for i := range d.Attempts {
		resp.Attempts = append(resp.Attempts, toAttemptDTO(&d.Attempts[i]))
	}
	for _, e := range d.Events {
		resp.Events = append(resp.Events, eventDTO{Kind: e.Kind, Actor: e.Actor, Detail: e.Detail, CreatedAt: e.CreatedAt})
	}
	return resp
}

// handleListOperations is GET /v1/operations: the reconciliation queue (state=uncertain),
// oldest first by the time each operation became uncertain.
func handleListOperations(reads *services.Reads) fiber.Handler {
	return func(c *fiber.Ctx) error {
		limit, err := queryLimit(c)
		if err != nil {
			return err
		}
		page, err := reads.ListOperations(c.UserContext(), principal(c).TenantID, services.OperationFilter{
			State: c.Query("state"), Limit: limit, Cursor: c.Query("cursor")})
		if err != nil {
			return err
		}
		return c.JSON(toOperationList(page.Items, page.NextCursor))
	}
}

// toOperationList is the body of GET /v1/operations: items, then the next page's cursor.
func toOperationList(items []services.QueuedOperation, next string) operationListResponse {
	resp := operationListResponse{Items: make([]queuedOperationDTO, 0, len(items)), NextCursor: cursorPtr(next)}
	for i := range items {
		q := &items[i]
		resp.Items = append(resp.Items, queuedOperationDTO{operationDTO: toOperationDTO(&q.Operation),
			UncertainAt: q.UncertainAt.UTC(), Superseded: q.Superseded})
	}
	return resp
}

func handleListAttempts(reads *services.Reads) fiber.Handler {
	return func(c *fiber.Ctx) error {
		limit, err := queryLimit(c)
		if err != nil {
			return err
		}
		f := services.AttemptFilter{Key: c.Query("key"), Result: c.Query("result"), Limit: limit, Cursor: c.Query("cursor")}
		if s := c.Query("since"); s != "" {
			t, err := time.Parse(time.RFC3339Nano, s)
			if err != nil {
				return &services.Error{Code: services.CodeInvalidRequest, Message: "The request has invalid fields.",
					Fields: []services.FieldError{{Field: "since", Message: "must be an RFC 3339 time, e.g. 2026-01-02T15:04:05Z"}}}
			}
			f.Since = &t
		}
		page, err := reads.ListAttempts(c.UserContext(), principal(c).TenantID, f)
		if err != nil {
			return err
		}
		resp := attemptListResponse{Items: make([]attemptDTO, 0, len(page.Items)), NextCursor: cursorPtr(page.NextCursor)}
		for i := range page.Items {
			resp.Items = append(resp.Items, toAttemptDTO(&page.Items[i]))
		}
		return c.JSON(resp)
	}
}
