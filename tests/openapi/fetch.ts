// Type-checked (tsc --noEmit, never run) against the types openapi-typescript
// generates from internal/api/openapi.json into gen/schema.d.ts: what a user
// of openapi-fetch writes first must compile as it is.
import createClient from "openapi-fetch";
import type { paths } from "./gen/schema";

const client = createClient<paths>({
  baseUrl: "http://127.0.0.1:8080",
  headers: { Authorization: "Bearer kubo_sk_..." },
});

export async function run(): Promise<string> {
  const { data, error } = await client.POST("/v1/executions", {
    body: { language: "python", code: "print(6 * 7)" },
  });
  if (error) {
    throw new Error(`${error.error.code}: ${error.error.message} (${error.request_id})`);
  }
  const status: string = data.status;
  const exitCode: number | null = data.exit_code;
  return `${data.id} ${status} ${exitCode}: ${data.stdout}`;
}

export async function withOptions(): Promise<void> {
  const { data } = await client.POST("/v1/executions", {
    body: {
      language: "python",
      code: "open('out.txt', 'w').write('hi')",
      image: "default",
      files: [{ path: "in/a.txt", content: "aGk=", encoding: "base64" }],
      return_files: ["*.txt"],
    },
    params: { header: { "Idempotency-Key": "order-42" } },
  });
  for (const f of data?.files ?? []) {
    const path: string = f.path;
    const content: string = f.content;
    void path, content;
  }
  const got = await client.GET("/v1/executions/{id}", { params: { path: { id: data?.id ?? "" } } });
  void got.data?.stdout;
}
