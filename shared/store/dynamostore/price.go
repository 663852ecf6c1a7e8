package dynamostore

// Prices are DynamoDB's on-demand request prices, in US dollars per million
// request units. On demand, a read request unit is what a Meter calls one
// RCU (a strongly consistent read of up to 4 KB; an eventually consistent
// one is half) and a write request unit one WCU, so a Usage prices directly.
type Prices struct {
	ReadPerMillion, WritePerMillion float64
}

// OnDemandUSEast1 is the Standard table class in us-east-1, as published on
// aws.amazon.com/dynamodb/pricing/on-demand since the price cut of
// November 2024. Storage, backups and data transfer are not included.
var OnDemandUSEast1 = Prices{ReadPerMillion: 0.125, WritePerMillion: 0.625}

// Dollars is what u's request units cost at p.
func (u Usage) Dollars(p Prices) float64 {
	return (u.TotalRCU()*p.ReadPerMillion + u.TotalWCU()*p.WritePerMillion) / 1e6
}
