package web

import (
	"bytes"
	"encoding/json"
	"strconv"

	"github.com/gofiber/fiber/v2"
	"github.com/idemgate/idemgate/services"
	"github.com/valyala/fasthttp"
)

// batchPath is the path of POST /v1/acquire:batch. Fiber reads ':' in a pattern as a
// parameter marker, so the route is registered with it escaped (batchRoute, relative to the
// /v1 group); the router then matches the literal colon only.
const (
	batchPath  = "/v1/acquire:batch"
	batchRoute = `/acquire\:batch`
)

// MaxBatchBodyBytes is the body limit of POST /v1/acquire:batch: 500 items of a typical size
// fit, where every other route keeps services.MaxBodyBytes (256 KiB).
const MaxBatchBodyBytes = 2 << 20

// bodyLimitFor is the body limit of a request to rawPath (as sent, still percent-encoded; a
// query string is ignored): MaxBatchBodyBytes for the batch path, services.MaxBodyBytes for
// everything else. The path is compared as the router compares it (case-insensitive, a
// trailing slash ignored), so every request routed to the batch handler gets its limit and
// no request routed elsewhere does.
func bodyLimitFor(rawPath []byte) int {
	if i := bytes.IndexByte(rawPath, '?'); i >= 0 {
		rawPath = rawPath[:i]
	}
	if len(rawPath) > 1 {
		rawPath = bytes.TrimSuffix(rawPath, []byte("/"))
	}
	if bytes.EqualFold(rawPath, []byte(batchPath)) {
		return MaxBatchBodyBytes
	}
	return services.MaxBodyBytes
}

// headerReceived is the HTTP server's per-request configuration, decided once the headers are
// read and before any body byte is: the HTTP server refuses a body over the limit there (413,
// without reading it), so the batch route's larger limit has to be set here rather than in a
// handler, and the global BodyLimit stays at services.MaxBodyBytes for every other route.
func headerReceived(h *fasthttp.RequestHeader) fasthttp.RequestConfig {
	if !h.IsPost() {
		return fasthttp.RequestConfig{}
	}
	if limit := bodyLimitFor(h.RequestURI()); limit != services.MaxBodyBytes {
		return fasthttp.RequestConfig{MaxRequestBodySize: limit}
	}
	return fasthttp.RequestConfig{}
}

// batchRequest is the envelope of POST /v1/acquire:batch. Items stay raw so that each is
// decoded exactly as the single endpoint decodes its body (decodeAcquire).
type batchRequest struct {
	Items []json.RawMessage `json:"items"`
}

// batchResult is one item's answer: the HTTP status the same body sent alone to
// POST /v1/acquire would have been answered, with that answer's body (201 admission, 200
// duplicate) or its problem document (4xx; request_id is the batch request's).
type batchResult struct {
	Status  int      `json:"status"`
	Body    any      `json:"body,omitempty"`
	Problem *problem `json:"problem,omitempty"`
}

type batchResponse struct {
	Results []batchResult `json:"results"`
}

// decodeBatch reads the envelope of POST /v1/acquire:batch: one JSON object with exactly the
// member "items", an array of 1 to services.MaxBatchItems values of any JSON type (each item
// is checked on its own by decodeAcquire). Errors are services.ErrInvalidRequest for the whole
// request.
func decodeBatch(body []byte) ([]json.RawMessage, error) {
	var req batchRequest
	if err := decodeJSON(body, &req); err != nil {
		return nil, err
	}
	if req.Items == nil {
		return nil, required("items")
	}
	if len(req.Items) < 1 || len(req.Items) > services.MaxBatchItems {
		return nil, fieldError("items", "must hold 1 to "+strconv.Itoa(services.MaxBatchItems)+" acquire requests")
	}
	return req.Items, nil
}

// handleAcquireBatch is POST /v1/acquire:batch: up to services.MaxBatchItems acquire requests
// decided in order in one database round trip (services.Admission.AcquireBatch), each answered
// in "results", in item order, with what POST /v1/acquire would have answered it. Items are
// independent: a refused item (invalid, fingerprint_mismatch, over the single endpoint's body
// limit) is refused alone. The whole request is refused only for its envelope (400, 413), its
// authentication, or the store (503: nothing was decided, or every item's attempt_id retry
// gets its operation back).
func handleAcquireBatch(adm *services.Admission) fiber.Handler {
	return func(c *fiber.Ctx) error {
		items, err := decodeBatch(c.Body())
		if err != nil {
			return err
		}
		rid := requestID(c)
		results := make([]batchResult, len(items))
		// refuse answers item i with err's problem, through the same mapping as the error
		// handler; an error that is not the client's (internal) fails the whole request.
		refuse := func(i int, err error) error {
			de, internal := toDomainError(err, services.MaxBodyBytes)
			if internal {
				return err
			}
			status := statusFor(c, de)
			p := newProblem(status, de, rid)
			results[i] = batchResult{Status: status, Problem: &p}
			return nil
		}
		inputs := make([]services.AcquireInput, 0, len(items))
		idx := make([]int, 0, len(items))
		for i, raw := range items {
			var in services.AcquireInput
			var err error
			if len(raw) > services.MaxBodyBytes {
				// Alone, this body would have been refused by the single endpoint's limit.
				err = payloadTooLarge(services.MaxBodyBytes)
			} else {
				in, err = decodeAcquire(raw)
			}
			if err != nil {
				if err := refuse(i, err); err != nil {
					return err
				}
				continue
			}
			inputs = append(inputs, in)
			idx = append(idx, i)
		}
		if len(inputs) > 0 {
			decided, err := adm.AcquireBatch(c.UserContext(), principal(c), inputs)
			if err != nil {
				return err
			}
			for j, d := range decided {
				i := idx[j]
				if d.Err != nil {
					if err := refuse(i, d.Err); err != nil {
						return err
					}
					continue
				}
				status, body := acquireAnswer(d.Acquisition)
				results[i] = batchResult{Status: status, Body: body}
			}
		}
		traceBatch(c, results)
		return c.JSON(batchResponse{Results: results})
	}
}
