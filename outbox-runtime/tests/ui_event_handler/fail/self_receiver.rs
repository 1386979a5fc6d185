#[path = "../event.rs"]
mod event;

#[allow(unused_imports)]
use event::*;
use txoutbox_runtime::consumer::event_handler;
#[allow(unused_imports)]
use sqlx::{Postgres, Transaction};

struct Payments;

impl Payments {
    #[event_handler]
    async fn on_paid(&self, _tx: &mut Transaction<'_, Postgres>, _event: Paid) -> Result<(), sqlx::Error> {
        Ok(())
    }
}

fn main() {}
