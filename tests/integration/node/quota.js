// The official OpenAI Node SDK meeting a tenant's exhausted budget: a 429
// whose code is insufficient_quota, not retried (the SDK's default 2
// retries are left on: the gateway's x-should-retry: false stops them).
// Usage: node quota.js BASE_URL API_KEY MODEL
// Prints one JSON line: {"status", "type", "code", "retry": header seen}.
const OpenAI = require('openai');

async function main() {
    const [baseURL, apiKey, model] = process.argv.slice(2);
    const client = new OpenAI({ baseURL, apiKey, timeout: 60000 });
    try {
        await client.chat.completions.create({ model, messages: [{ role: 'user', content: 'hi' }], max_tokens: 2 });
        console.log(JSON.stringify({ status: 200 }));
    } catch (e) {
        console.log(JSON.stringify({
            status: e.status, type: e.type, code: e.code,
            retry: e.headers ? e.headers['x-should-retry'] : null,
            rate_limit_error: e instanceof OpenAI.RateLimitError,
        }));
    }
}

main().catch((e) => { console.error(e); process.exit(1); });
