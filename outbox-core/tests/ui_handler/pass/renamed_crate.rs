//! `crate = "..."` for a service that reaches the framework through a
//! re-export (or a renamed dependency): the generated code names that path.

mod outbox {
    pub use txoutbox_core::*;
}

use sqlx::{PgPool, Postgres, Transaction};

#[outbox::outbox_handler(crate = "crate::outbox", isolation = "serializable", retries = 2)]
async fn touch(tx: &mut Transaction<'_, Postgres>, _events: &mut outbox::Events) -> Result<i64, outbox::Error> {
    let one: i64 = sqlx::query_scalar("SELECT 1").fetch_one(&mut **tx).await.map_err(outbox::Error::Database)?;
    Ok(one)
}

fn main() {
    // Only the types matter here.
    let _ = |pool: PgPool| async move { touch(&pool).await };
}
