# The `ocxsite` app's models moved (issue #25): keys, tokens and user budgets to `accounts`,
# the request log and budget events to `usage`. Their tables stay; only Django's state forgets
# them here, after the new owners have taken them over.

from django.db import migrations


class Migration(migrations.Migration):

    dependencies = [
        ('ocxsite', '0002_budgets'),
        ('accounts', '0001_initial'),
        ('usage', '0002_requestlog_budgetevent'),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.DeleteModel(name='ClientKey'),
                migrations.DeleteModel(name='ManagementToken'),
                migrations.DeleteModel(name='UserBudget'),
                migrations.DeleteModel(name='RequestLog'),
                migrations.DeleteModel(name='BudgetEvent'),
            ],
            database_operations=[],
        ),
    ]
