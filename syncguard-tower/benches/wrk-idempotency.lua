-- wrk script for the overhead bench's `serve` mode: POST /jobs with a fresh Idempotency-Key on
-- every request (one wrk thread: the counter is per thread).
counter = 0
request = function()
  counter = counter + 1
  return wrk.format("POST", "/jobs", {["Idempotency-Key"] = "wrk-" .. counter})
end
