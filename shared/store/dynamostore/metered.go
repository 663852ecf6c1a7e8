package dynamostore

import (
	"context"
	"reflect"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
)

// metered is the API a Store uses when it has a Meter: every call goes to
// next unchanged and is then counted and priced. It learns write images with
// extra, unmetered GetItems on next (see Meter).
type metered struct {
	next    API
	meter   *Meter
	schemas map[string]tableSchema // by physical table name
}

var _ API = (*metered)(nil)

func (m *metered) schema(table *string) (tableSchema, bool) {
	t, ok := m.schemas[aws.ToString(table)]
	return t, ok
}

// image reads the item at key as it is now, strongly consistent and
// unmetered; nil when absent or unreadable (the price then assumes absent).
func (m *metered) image(ctx context.Context, table *string, key item) item {
	out, err := m.next.GetItem(ctx, &dynamodb.GetItemInput{TableName: table, Key: key, ConsistentRead: aws.Bool(true)})
	if err != nil || out.Item == nil {
		return nil
	}
	return out.Item
}

func keyOf(t tableSchema, it item) item {
	k := item{}
	for _, name := range t.keys {
		if v, ok := it[name]; ok {
			k[name] = v
		}
	}
	return k
}

func (m *metered) GetItem(ctx context.Context, in *dynamodb.GetItemInput, opts ...func(*dynamodb.Options)) (*dynamodb.GetItemOutput, error) {
	out, err := m.next.GetItem(ctx, in, opts...)
	m.meter.call("GetItem")
	if t, ok := m.schema(in.TableName); ok && err == nil {
		m.meter.read(t.logical, readUnits(ItemSize(out.Item), aws.ToBool(in.ConsistentRead)))
	}
	return out, err
}

func (m *metered) PutItem(ctx context.Context, in *dynamodb.PutItemInput, opts ...func(*dynamodb.Options)) (*dynamodb.PutItemOutput, error) {
	t, known := m.schema(in.TableName)
	var old item
	if known {
		old = m.image(ctx, in.TableName, keyOf(t, in.Item))
	}
	out, err := m.next.PutItem(ctx, in, opts...)
	m.meter.call("PutItem")
	if known {
		m.chargeSingle(t, old, in.Item, err, false)
	}
	return out, err
}

func (m *metered) UpdateItem(ctx context.Context, in *dynamodb.UpdateItemInput, opts ...func(*dynamodb.Options)) (*dynamodb.UpdateItemOutput, error) {
	t, known := m.schema(in.TableName)
	var old item
	if known {
		old = m.image(ctx, in.TableName, in.Key)
	}
	out, err := m.next.UpdateItem(ctx, in, opts...)
	m.meter.call("UpdateItem")
	if known {
		var new item
		if err == nil {
			if in.ReturnValues == types.ReturnValueAllNew {
				new = out.Attributes
			} else {
				new = m.image(ctx, in.TableName, in.Key)
			}
		}
		m.chargeSingle(t, old, new, err, false)
	}
	return out, err
}

func (m *metered) DeleteItem(ctx context.Context, in *dynamodb.DeleteItemInput, opts ...func(*dynamodb.Options)) (*dynamodb.DeleteItemOutput, error) {
	t, known := m.schema(in.TableName)
	var old item
	if known {
		old = m.image(ctx, in.TableName, in.Key)
	}
	out, err := m.next.DeleteItem(ctx, in, opts...)
	m.meter.call("DeleteItem")
	if known {
		m.chargeSingle(t, old, nil, err, false)
	}
	return out, err
}

// chargeSingle prices a single-item write by its outcome: success, a failed
// condition (which still costs), or another error (which costs nothing).
func (m *metered) chargeSingle(t tableSchema, old, new item, err error, transactional bool) {
	if failed, holder := conditionFailed(err); failed {
		if holder != nil {
			old = holder
		}
		m.meter.chargeWrite(t, old, nil, false, transactional)
		return
	}
	if err == nil {
		m.meter.chargeWrite(t, old, new, true, transactional)
	}
}

func (m *metered) Query(ctx context.Context, in *dynamodb.QueryInput, opts ...func(*dynamodb.Options)) (*dynamodb.QueryOutput, error) {
	out, err := m.next.Query(ctx, in, opts...)
	m.meter.call("Query")
	if t, ok := m.schema(in.TableName); ok && err == nil {
		target := t.logical
		if in.IndexName != nil {
			target += "/" + aws.ToString(in.IndexName)
		}
		m.meter.read(target, readUnits(itemsSize(out.Items), aws.ToBool(in.ConsistentRead)))
	}
	return out, err
}

func (m *metered) Scan(ctx context.Context, in *dynamodb.ScanInput, opts ...func(*dynamodb.Options)) (*dynamodb.ScanOutput, error) {
	out, err := m.next.Scan(ctx, in, opts...)
	m.meter.call("Scan")
	if t, ok := m.schema(in.TableName); ok && err == nil {
		m.meter.read(t.logical, readUnits(itemsSize(out.Items), aws.ToBool(in.ConsistentRead)))
	}
	return out, err
}

func itemsSize(items []map[string]types.AttributeValue) int {
	n := 0
	for _, it := range items {
		n += ItemSize(it)
	}
	return n
}

func (m *metered) BatchGetItem(ctx context.Context, in *dynamodb.BatchGetItemInput, opts ...func(*dynamodb.Options)) (*dynamodb.BatchGetItemOutput, error) {
	out, err := m.next.BatchGetItem(ctx, in, opts...)
	m.meter.call("BatchGetItem")
	if err != nil {
		return out, err
	}
	for table, req := range in.RequestItems {
		t, ok := m.schemas[table]
		if !ok {
			continue
		}
		consistent := aws.ToBool(req.ConsistentRead)
		found := out.Responses[table]
		unprocessed := len(out.UnprocessedKeys[table].Keys)
		for _, it := range found {
			m.meter.read(t.logical, readUnits(ItemSize(it), consistent))
		}
		// A key read but not found still costs the minimum.
		if missing := len(req.Keys) - len(found) - unprocessed; missing > 0 {
			m.meter.read(t.logical, float64(missing)*readUnits(0, consistent))
		}
	}
	return out, err
}

func (m *metered) BatchWriteItem(ctx context.Context, in *dynamodb.BatchWriteItemInput, opts ...func(*dynamodb.Options)) (*dynamodb.BatchWriteItemOutput, error) {
	type pending struct {
		t        tableSchema
		table    string
		key      item
		old, new item
	}
	var writes []pending
	for table, reqs := range in.RequestItems {
		t, ok := m.schemas[table]
		if !ok {
			continue
		}
		for _, r := range reqs {
			p := pending{t: t, table: table}
			switch {
			case r.PutRequest != nil:
				p.key, p.new = keyOf(t, r.PutRequest.Item), r.PutRequest.Item
			case r.DeleteRequest != nil:
				p.key = r.DeleteRequest.Key
			}
			p.old = m.image(ctx, aws.String(table), p.key)
			writes = append(writes, p)
		}
	}
	out, err := m.next.BatchWriteItem(ctx, in, opts...)
	m.meter.call("BatchWriteItem")
	if err != nil {
		return out, err
	}
	for _, p := range writes {
		if !unprocessedWrite(out.UnprocessedItems[p.table], p.t, p.key) {
			m.meter.chargeWrite(p.t, p.old, p.new, true, false)
		}
	}
	return out, err
}

func unprocessedWrite(reqs []types.WriteRequest, t tableSchema, key item) bool {
	for _, r := range reqs {
		var k item
		switch {
		case r.PutRequest != nil:
			k = keyOf(t, r.PutRequest.Item)
		case r.DeleteRequest != nil:
			k = r.DeleteRequest.Key
		}
		if reflect.DeepEqual(k, key) {
			return true
		}
	}
	return false
}

func (m *metered) TransactWriteItems(ctx context.Context, in *dynamodb.TransactWriteItemsInput, opts ...func(*dynamodb.Options)) (*dynamodb.TransactWriteItemsOutput, error) {
	type action struct {
		t        tableSchema
		table    *string
		key      item
		old, new item
		update   bool
	}
	var actions []action
	for _, ti := range in.TransactItems {
		var a action
		switch {
		case ti.Put != nil:
			a.table, a.new = ti.Put.TableName, ti.Put.Item
		case ti.Delete != nil:
			a.table, a.key = ti.Delete.TableName, ti.Delete.Key
		case ti.Update != nil:
			a.table, a.key, a.update = ti.Update.TableName, ti.Update.Key, true
		case ti.ConditionCheck != nil:
			a.table, a.key = ti.ConditionCheck.TableName, ti.ConditionCheck.Key
		}
		t, ok := m.schema(a.table)
		if !ok {
			continue
		}
		a.t = t
		if a.new != nil {
			a.key = keyOf(t, a.new)
		}
		a.old = m.image(ctx, a.table, a.key)
		if ti.ConditionCheck != nil {
			a.new = a.old // checked, not changed
		}
		actions = append(actions, a)
	}
	out, err := m.next.TransactWriteItems(ctx, in, opts...)
	m.meter.call("TransactWriteItems")
	canceled, _, _ := canceledBy(err)
	for _, a := range actions {
		switch {
		case canceled:
			m.meter.chargeWrite(a.t, a.old, nil, false, true)
		case err == nil:
			if a.update {
				a.new = m.image(ctx, a.table, a.key)
			}
			m.meter.chargeWrite(a.t, a.old, a.new, true, true)
		}
	}
	return out, err
}

// Table administration passes through unmetered.

func (m *metered) CreateTable(ctx context.Context, in *dynamodb.CreateTableInput, opts ...func(*dynamodb.Options)) (*dynamodb.CreateTableOutput, error) {
	return m.next.CreateTable(ctx, in, opts...)
}

func (m *metered) DescribeTable(ctx context.Context, in *dynamodb.DescribeTableInput, opts ...func(*dynamodb.Options)) (*dynamodb.DescribeTableOutput, error) {
	return m.next.DescribeTable(ctx, in, opts...)
}

func (m *metered) DescribeTimeToLive(ctx context.Context, in *dynamodb.DescribeTimeToLiveInput, opts ...func(*dynamodb.Options)) (*dynamodb.DescribeTimeToLiveOutput, error) {
	return m.next.DescribeTimeToLive(ctx, in, opts...)
}

func (m *metered) UpdateTimeToLive(ctx context.Context, in *dynamodb.UpdateTimeToLiveInput, opts ...func(*dynamodb.Options)) (*dynamodb.UpdateTimeToLiveOutput, error) {
	return m.next.UpdateTimeToLive(ctx, in, opts...)
}
