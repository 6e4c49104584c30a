# The request log and budget events move here from the `ocxsite` app (issue #25). Their tables
# stay where they are (`db_table` keeps the old names): this migration only tells Django's
# state that `usage` owns them, and carries the content types over (permissions, admin
# history). A fresh database gets the tables from `ocxsite` 0001/0002, which run first.

from django.db import migrations, models

MODELS = ("requestlog", "budgetevent")


def _move_content_types(apps, schema_editor, old, new):
    content_type = apps.get_model("contenttypes", "ContentType")
    db = schema_editor.connection.alias
    for model in MODELS:
        if not content_type.objects.using(db).filter(app_label=new, model=model).exists():
            content_type.objects.using(db).filter(app_label=old, model=model).update(app_label=new)


def forwards(apps, schema_editor):
    _move_content_types(apps, schema_editor, "ocxsite", "usage")


def backwards(apps, schema_editor):
    _move_content_types(apps, schema_editor, "usage", "ocxsite")


class Migration(migrations.Migration):

    dependencies = [
        ('usage', '0001_initial'),
        ('ocxsite', '0002_budgets'),
        ('contenttypes', '0002_remove_content_type_name'),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.CreateModel(
                    name='RequestLog',
                    fields=[
                        ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                        ('request_id', models.CharField(db_index=True, max_length=40)),
                        ('at', models.DateTimeField(db_index=True)),
                        ('key_prefix', models.CharField(blank=True, default='', max_length=16)),
                        ('user', models.CharField(blank=True, default='', max_length=150)),
                        ('requested_model', models.CharField(blank=True, default='', max_length=256)),
                        ('combo', models.CharField(blank=True, default='', max_length=64)),
                        ('target', models.CharField(blank=True, default='', max_length=512)),
                        ('status', models.PositiveIntegerField(default=0)),
                        ('outcome', models.CharField(blank=True, default='', max_length=32)),
                        ('stream', models.BooleanField(default=False)),
                        ('duration_ms', models.PositiveIntegerField(default=0)),
                        ('input_tokens', models.PositiveIntegerField(blank=True, null=True)),
                        ('output_tokens', models.PositiveIntegerField(blank=True, null=True)),
                        ('cached_tokens', models.PositiveIntegerField(blank=True, null=True)),
                        ('attempts', models.JSONField(blank=True, default=list)),
                        ('skipped', models.JSONField(blank=True, default=list)),
                    ],
                    options={
                        'db_table': 'ocxsite_requestlog',
                        'ordering': ('-at',),
                    },
                ),
                migrations.CreateModel(
                    name='BudgetEvent',
                    fields=[
                        ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                        ('at', models.DateTimeField(db_index=True)),
                        ('owner', models.CharField(max_length=200)),
                        ('scope', models.CharField(max_length=8)),
                        ('percent', models.PositiveSmallIntegerField()),
                        ('budget', models.JSONField(default=dict)),
                        ('window', models.CharField(blank=True, default='', max_length=32)),
                        ('used', models.FloatField()),
                        ('limit', models.FloatField()),
                        ('resets_at', models.DateTimeField()),
                        ('message', models.TextField()),
                    ],
                    options={
                        'db_table': 'ocxsite_budgetevent',
                        'ordering': ('-at',),
                    },
                ),
            ],
            database_operations=[],
        ),
        migrations.RunPython(forwards, backwards),
    ]
