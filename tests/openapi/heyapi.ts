// Type-checked (tsc --noEmit, never run) against the client @hey-api/openapi-ts
// generates from internal/api/openapi.json into gen/hey/: the obvious call
// must compile as it is.
import { createClient } from "./gen/hey/client";
import { runCode, getExecution } from "./gen/hey/sdk.gen";

const client = createClient({
  baseUrl: "http://127.0.0.1:8080",
  headers: { Authorization: "Bearer kubo_sk_..." },
});

export async function run(): Promise<string> {
  const { data, error } = await runCode({ client, body: { language: "python", code: "print(6 * 7)" } });
  if (error) {
    throw new Error(`${error.error.code}: ${error.error.message}`);
  }
  if (!data) {
    throw new Error("no body");
  }
  const exitCode: number | null = data.exit_code;
  const again = await getExecution({ client, path: { id: data.id } });
  return `${data.id} ${data.status} ${exitCode}: ${data.stdout} ${again.data?.stderr}`;
}
