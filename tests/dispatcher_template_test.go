package tests

import (
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/runfleet/runfleet/shared/wake"
)

// TestTemplateDispatcherConsumesTheWakeQueue: the dispatcher function is
// the wake queue's only consumer, through one event source mapping that
// delivers batches of wake.BatchSize at once, reads the dispatcher's
// partial batch failures and bounds its concurrency by a parameter. The
// queue hides a delivered batch for six times the function's timeout (AWS's
// guidance, and the local stack's wake.VisibilityTimeout), dead-letters a
// wake after wake.MaxReceiveCount deliveries into an encrypted queue that
// keeps it longer than the wake queue would, and is encrypted too.
func TestTemplateDispatcherConsumesTheWakeQueue(t *testing.T) {
	_, out := templates(t)
	res := jsonObj(out, "Resources")
	num := func(v any) int {
		t.Helper()
		n, err := strconv.ParseFloat(fmt.Sprint(v), 64)
		if err != nil || n != float64(int(n)) {
			t.Fatalf("%v is not a whole number", v)
		}
		return int(n)
	}

	mappings := resourcesOfType(out, "AWS::Lambda::EventSourceMapping")
	if len(mappings) != 1 {
		t.Fatalf("event source mappings %v, want the dispatcher's alone", mappings)
	}
	m := jsonObj(res, mappings[0], "Properties")
	if jsonObj(m, "FunctionName")["Ref"] != "DispatcherFunction" || getAtt(m["EventSourceArn"], "Arn") != "DispatchWakes" {
		t.Fatalf("the mapping %v: want DispatchWakes into DispatcherFunction", m)
	}
	if num(m["BatchSize"]) != wake.BatchSize || num(m["MaximumBatchingWindowInSeconds"]) != 0 {
		t.Errorf("the mapping's batches: size %v, window %v; want %d (wake.BatchSize), no window", m["BatchSize"], m["MaximumBatchingWindowInSeconds"], wake.BatchSize)
	}
	if fmt.Sprint(m["FunctionResponseTypes"]) != "[ReportBatchItemFailures]" {
		t.Errorf("the mapping's response types %v: without ReportBatchItemFailures one failed wake redelivers its whole batch", m["FunctionResponseTypes"])
	}
	if jsonObj(m, "ScalingConfig", "MaximumConcurrency")["Ref"] != "DispatcherMaxConcurrency" {
		t.Errorf("the mapping's concurrency %v, want the DispatcherMaxConcurrency parameter", m["ScalingConfig"])
	}

	fn := jsonObj(res, "DispatcherFunction", "Properties")
	timeout := time.Duration(num(fn["Timeout"])) * time.Second
	if timeout != wake.DispatcherTimeout {
		t.Errorf("the dispatcher's timeout %v, want wake.DispatcherTimeout %v (the local stack's deadline)", timeout, wake.DispatcherTimeout)
	}
	q := jsonObj(res, "DispatchWakes", "Properties")
	visibility := time.Duration(num(q["VisibilityTimeout"])) * time.Second
	if visibility < 6*timeout || visibility != wake.VisibilityTimeout {
		t.Errorf("the queue's visibility timeout %v: want 6 x the function's %v, and wake.VisibilityTimeout %v", visibility, timeout, wake.VisibilityTimeout)
	}
	redrive := jsonObj(q, "RedrivePolicy")
	if getAtt(redrive["deadLetterTargetArn"], "Arn") != "DispatchWakesDeadLetterQueue" || num(redrive["maxReceiveCount"]) != wake.MaxReceiveCount {
		t.Errorf("the queue's redrive policy %v: want DispatchWakesDeadLetterQueue after wake.MaxReceiveCount (%d)", redrive, wake.MaxReceiveCount)
	}
	retention := time.Duration(num(q["MessageRetentionPeriod"])) * time.Second
	if retention <= time.Duration(wake.MaxReceiveCount)*visibility {
		t.Errorf("the queue keeps a wake %v: a failing one would expire before its %d deliveries reach the dead-letter queue", retention, wake.MaxReceiveCount)
	}
	dlq := jsonObj(res, "DispatchWakesDeadLetterQueue", "Properties")
	if time.Duration(num(dlq["MessageRetentionPeriod"]))*time.Second <= retention {
		// SQS keeps a message's first enqueue time when it moves it: a
		// dead-letter queue that keeps less drops it at once.
		t.Errorf("the dead-letter queue keeps %v s, not longer than the queue's %v", dlq["MessageRetentionPeriod"], retention)
	}
	for _, id := range []string{"DispatchWakes", "DispatchWakesDeadLetterQueue"} {
		if p := jsonObj(res, id, "Properties"); p["SqsManagedSseEnabled"] != true && p["KmsMasterKeyId"] == nil {
			t.Errorf("queue %s is not encrypted: %v", id, p)
		}
	}
	if p := jsonObj(out, "Parameters", "DispatcherMaxConcurrency"); num(p["MinValue"]) < 2 || num(p["MaxValue"]) > 1000 {
		t.Errorf("DispatcherMaxConcurrency %v: SQS mappings take 2 to 1000", p)
	}

	// Who may send wakes, and who may consume them: every function records
	// runs' ends or learns of hosts' room, so every one sends (the
	// dispatcher too: a run whose interrupted start it resumes may have
	// ended on its host); the dispatcher alone receives, on this queue
	// alone; nobody writes to the dead-letter queue (SQS moves wakes there
	// itself).
	s := newIAMStack(t)
	r := s.resolver(nil)
	queue, dead := r.attrs["DispatchWakes.Arn"], r.attrs["DispatchWakesDeadLetterQueue.Arn"]
	for id := range templateFunctions {
		stmts, _ := deployedRole(t, s.tpl, r, id)
		allowed := func(action, resource string) bool {
			for _, st := range stmts {
				if st.allows(awsCall{action, resource}) {
					return true
				}
			}
			return false
		}
		consumer := id == "DispatcherFunction"
		for _, action := range []string{"sqs:ReceiveMessage", "sqs:DeleteMessage", "sqs:ChangeMessageVisibility", "sqs:GetQueueAttributes"} {
			if allowed(action, queue) != consumer || allowed(action, dead) {
				t.Errorf("%s: %s on the wake queue %v, on its dead letters %v; want only the dispatcher, on the wake queue", id, action, allowed(action, queue), allowed(action, dead))
			}
		}
		if !allowed("sqs:SendMessage", queue) {
			t.Errorf("%s may not send wakes: it records runs' ends (or finds hosts with room)", id)
		}
		if allowed("sqs:SendMessage", dead) {
			t.Errorf("%s may write to the wakes' dead-letter queue", id)
		}
	}
}
