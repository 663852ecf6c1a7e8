package wake

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/runfleet/runfleet/shared/fleet"
)

// SQSAPI is the part of the SQS client the sender uses (sqs.Client). It
// honours ctx and is safe for concurrent use.
type SQSAPI interface {
	SendMessageBatch(ctx context.Context, in *sqs.SendMessageBatchInput, optFns ...func(*sqs.Options)) (*sqs.SendMessageBatchOutput, error)
}

var _ SQSAPI = (*sqs.Client)(nil)

// sqsBatchMax is SQS's most entries in one SendMessageBatch.
const sqsBatchMax = 10

// SQS sends wakes to an SQS queue (RUNFLEET_WAKE_QUEUE), whose event
// source mapping invokes the dispatcher function with them. Safe for
// concurrent use.
type SQS struct {
	client   SQSAPI
	queueURL string
}

var _ fleet.Waker = (*SQS)(nil)

// NewSQS is the sender to queueURL through client.
func NewSQS(client SQSAPI, queueURL string) (*SQS, error) {
	if client == nil || queueURL == "" {
		return nil, errors.New("wake: NewSQS needs a client and a queue URL")
	}
	return &SQS{client: client, queueURL: queueURL}, nil
}

// Wake sends wakes, one message per host (coalesced), in batches of ten
// (one SendMessageBatch each: what sqs:SendMessage allows). It returns an
// error when any message was not sent, naming how many and SQS's codes;
// the messages sent stay sent (a delivery is at least once anyway).
func (s *SQS) Wake(ctx context.Context, wakes []fleet.Wake) error {
	bodies, err := encodeAll(wakes)
	if err != nil {
		return err
	}
	var failed []string
	for start := 0; start < len(bodies); start += sqsBatchMax {
		batch := bodies[start:min(start+sqsBatchMax, len(bodies))]
		entries := make([]types.SendMessageBatchRequestEntry, len(batch))
		for i, b := range batch {
			entries[i] = types.SendMessageBatchRequestEntry{Id: aws.String(strconv.Itoa(i)), MessageBody: aws.String(b)}
		}
		out, err := s.client.SendMessageBatch(ctx, &sqs.SendMessageBatchInput{QueueUrl: aws.String(s.queueURL), Entries: entries})
		if err != nil {
			return fmt.Errorf("wake: sending %d wakes to the queue: %w", len(bodies)-start, err)
		}
		for _, f := range out.Failed {
			failed = append(failed, aws.ToString(f.Code))
		}
	}
	if len(failed) > 0 {
		return fmt.Errorf("wake: SQS refused %d of %d wakes: %s", len(failed), len(bodies), strings.Join(failed, ", "))
	}
	return nil
}
