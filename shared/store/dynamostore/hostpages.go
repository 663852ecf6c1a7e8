package dynamostore

import (
	"context"
	"strings"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/runfleet/runfleet/shared/store"
)

// ListHostsPage is one Scan of the hosts table (eventually consistent)
// from the key after, at most limit items: its cost is that page's bytes,
// whatever the size of the registry. Fleet-internal items (ids beginning
// with "#") count toward the limit and are skipped, so a page may be short.
func (s *Store) ListHostsPage(ctx context.Context, after string, limit int) (store.HostPage, error) {
	in := &dynamodb.ScanInput{TableName: aws.String(s.tables.Hosts), Limit: aws.Int32(int32(store.PageLimit(limit)))}
	if after != "" {
		in.ExclusiveStartKey = strKey(attrID, after)
	}
	out, err := s.api.Scan(ctx, in)
	if err != nil {
		return store.HostPage{}, fault("list a page of hosts", err)
	}
	var page store.HostPage
	for _, it := range out.Items {
		if id, ok := it[attrID].(*types.AttributeValueMemberS); ok && strings.HasPrefix(id.Value, "#") {
			continue
		}
		h, err := hostFromItem(it)
		if err != nil {
			return store.HostPage{}, fault("list a page of hosts", err)
		}
		page.Hosts = append(page.Hosts, h)
	}
	if id, ok := out.LastEvaluatedKey[attrID].(*types.AttributeValueMemberS); ok {
		page.Next = id.Value
	}
	return page, nil
}
