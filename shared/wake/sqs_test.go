package wake

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"

	"github.com/runfleet/runfleet/shared/fleet"
	"github.com/runfleet/runfleet/tests/kit/motoserver"
)

// newQueue creates a queue of its own on moto and returns its URL.
func newQueue(t *testing.T, client *sqs.Client) string {
	t.Helper()
	out, err := client.CreateQueue(context.Background(), &sqs.CreateQueueInput{QueueName: aws.String(motoserver.Unique("wakes"))})
	if err != nil {
		t.Fatal(err)
	}
	return aws.ToString(out.QueueUrl)
}

// receiveAll drains the queue: every message's body, decoded.
func receiveAll(t *testing.T, client *sqs.Client, url string) []fleet.Wake {
	t.Helper()
	var got []fleet.Wake
	for {
		out, err := client.ReceiveMessage(context.Background(), &sqs.ReceiveMessageInput{QueueUrl: aws.String(url), MaxNumberOfMessages: 10})
		if err != nil {
			t.Fatal(err)
		}
		if len(out.Messages) == 0 {
			return got
		}
		for _, m := range out.Messages {
			w, err := decode(aws.ToString(m.Body))
			if err != nil {
				t.Fatalf("a sent message does not decode: %v", err)
			}
			got = append(got, w)
			if _, err := client.DeleteMessage(context.Background(), &sqs.DeleteMessageInput{QueueUrl: aws.String(url), ReceiptHandle: m.ReceiptHandle}); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// TestSQSSendsOneMessagePerHost: wakes reach a real queue (moto), one
// message per host with the host's slots added, past SQS's ten entries a
// batch.
func TestSQSSendsOneMessagePerHost(t *testing.T) {
	client := sqs.NewFromConfig(moto.AWSConfig())
	url := newQueue(t, client)
	w, err := NewSQS(client, url)
	if err != nil {
		t.Fatal(err)
	}
	var wakes []fleet.Wake
	for i := range 12 {
		wakes = append(wakes, fleet.Wake{HostID: fmt.Sprintf("edge-%02d", i), Slots: 1, Reason: fleet.WakeProbe})
	}
	wakes = append(wakes, fleet.Wake{HostID: "edge-03", Slots: 1, Reason: fleet.WakeRunEnded})
	if err := w.Wake(context.Background(), wakes); err != nil {
		t.Fatal(err)
	}
	got := receiveAll(t, client, url)
	sort.Slice(got, func(i, j int) bool { return got[i].HostID < got[j].HostID })
	if len(got) != 12 || got[3] != (fleet.Wake{HostID: "edge-03", Slots: 2, Reason: fleet.WakeProbe}) || got[11].HostID != "edge-11" {
		t.Fatalf("the queue holds %+v, want 12 messages, edge-03's with 2 slots", got)
	}
}

// TestSQSWakeErrorsSayWhatWasNotSent: a queue that does not exist, or a
// wake without a host, is an error for the caller to log; nothing is sent
// for a bad wake.
func TestSQSWakeErrorsSayWhatWasNotSent(t *testing.T) {
	client := sqs.NewFromConfig(moto.AWSConfig())
	url := newQueue(t, client)
	gone, err := NewSQS(client, url+"-missing")
	if err != nil {
		t.Fatal(err)
	}
	if err := gone.Wake(context.Background(), []fleet.Wake{{HostID: "edge-1", Slots: 1}}); err == nil || !strings.Contains(err.Error(), "sending 1 wakes") {
		t.Fatalf("a missing queue: %v", err)
	}
	w, _ := NewSQS(client, url)
	if err := w.Wake(context.Background(), []fleet.Wake{{HostID: "edge-1", Slots: 1}, {Slots: 1}}); err == nil {
		t.Fatal("a wake without a host was sent")
	}
	if got := receiveAll(t, client, url); len(got) != 0 {
		t.Fatalf("the batch with a bad wake sent %+v", got)
	}
	if _, err := NewSQS(nil, url); err == nil {
		t.Fatal("NewSQS without a client")
	}
}
