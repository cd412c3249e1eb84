// @hey-api/openapi-ts: its default plugins (types, SDK, fetch client) from
// the API's document into gen/hey/, which tests/openapi/openapi_test.go
// type-checks with heyapi.ts.
export default {
  input: "../../internal/api/openapi.json",
  output: "gen/hey",
};
